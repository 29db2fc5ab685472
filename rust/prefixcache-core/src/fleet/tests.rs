use super::*;

fn stored(hashes: &[u64], medium: Option<&str>) -> FleetEvent {
    FleetEvent::Stored(Stored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: None,
        num_tokens: 0,
        block_size: 16,
        lora_id: None,
        lora_name: None,
        medium: medium.map(str::to_owned),
        group_idx: 0,
    })
}

fn removed(hashes: &[u64], medium: Option<&str>) -> FleetEvent {
    FleetEvent::Removed {
        block_hashes: hashes.to_vec(),
        medium: medium.map(str::to_owned),
        group_idx: 0,
    }
}

fn index() -> KvIndex {
    KvIndex::new(HashForm::default(), Some(10.0)).unwrap()
}

#[test]
fn last_copy_removal_only() {
    let mut ix = index();
    ix.apply("a", &[stored(&[1, 2], None), stored(&[2], None)], None, 0.0)
        .unwrap();
    ix.apply("a", &[removed(&[2], None)], None, 0.0).unwrap();
    assert_eq!(ix.cached_hashes("a", None).unwrap(), vec![1, 2]);
    ix.apply("a", &[removed(&[2], None)], None, 0.0).unwrap();
    assert_eq!(ix.cached_hashes("a", None).unwrap(), vec![1]);
    ix.check_invariants().unwrap();
}

#[test]
fn media_are_separate() {
    let mut ix = index();
    ix.apply(
        "a",
        &[stored(&[1, 2, 3], None), stored(&[1, 2], Some("CPU"))],
        None,
        0.0,
    )
    .unwrap();
    ix.apply("a", &[removed(&[2], None)], None, 0.0).unwrap();
    let m = ix.longest_prefix(&[1, 2, 3], 0.0, None).unwrap();
    let w = m.get(0).unwrap();
    assert_eq!(&*m.media[0], "GPU");
    assert_eq!(w.per_medium.as_slice(), &[1, 2]);
    // Block 2 is only on CPU, blocks 1 and 3 on GPU: all three are held on some medium.
    assert_eq!(w.blocks, 3);
    let weighted = ix
        .longest_prefix(&[1, 2, 3], 0.0, Some(&[("CPU".into(), 0.5)]))
        .unwrap();
    assert_eq!(weighted.score[0], 2.5);
    ix.check_invariants().unwrap();
}

#[test]
fn sequence_gap_duplicate_restart() {
    let mut ix = index();
    assert_eq!(
        ix.apply("a", &[stored(&[1], None)], Some(0), 0.0).unwrap(),
        ApplyOutcome::Applied
    );
    assert_eq!(
        ix.apply("a", &[stored(&[3], None)], Some(2), 0.0).unwrap(),
        ApplyOutcome::Gap
    );
    assert!(ix.status("a", 0.0).unwrap().stale);
    assert_eq!(
        ix.apply("a", &[stored(&[2], None)], Some(1), 0.0).unwrap(),
        ApplyOutcome::Applied
    );
    assert!(ix.status("a", 0.0).unwrap().stale);
    assert_eq!(
        ix.apply("a", &[stored(&[3], None)], Some(2), 0.0).unwrap(),
        ApplyOutcome::Applied
    );
    assert!(!ix.status("a", 0.0).unwrap().stale);
    assert_eq!(
        ix.apply("a", &[stored(&[9], None)], Some(1), 0.0).unwrap(),
        ApplyOutcome::Duplicate
    );
    assert_eq!(ix.cached_hashes("a", None).unwrap(), vec![1, 2, 3]);
    // Without timestamps a repeated batch 0 is a duplicate; with a new one, a restart.
    assert_eq!(
        ix.apply("a", &[stored(&[7], None)], Some(0), 0.0).unwrap(),
        ApplyOutcome::Duplicate
    );
    assert_eq!(
        ix.apply_stamped("a", &[stored(&[7], None)], Some(0), Some(5.0), 0.0)
            .unwrap(),
        ApplyOutcome::Applied
    );
    assert_eq!(ix.cached_hashes("a", None).unwrap(), vec![7]);
    assert_eq!(
        ix.apply_stamped("a", &[stored(&[8], None)], Some(0), Some(5.0), 0.0)
            .unwrap(),
        ApplyOutcome::Duplicate
    );
    assert_eq!(ix.status("a", 0.0).unwrap().restarts, 1);
    ix.check_invariants().unwrap();
}

#[test]
fn ttl_and_top_k() {
    let mut ix = index();
    ix.apply("a", &[stored(&[1, 2], None)], None, 0.0).unwrap();
    ix.apply("b", &[stored(&[1], None)], None, 5.0).unwrap();
    let top = ix.top_k(&[1, 2], 2, 12.0, None, false).unwrap();
    assert_eq!(top.len(), 1);
    assert_eq!(&*top[0].worker, "b");
    let top = ix.top_k(&[1, 2], 2, 1.0, None, false).unwrap();
    assert_eq!(&*top[0].worker, "a");
    assert_eq!(ix.prune_expired(12.0).expect("memory").len(), 1);
    assert_eq!(ix.workers().expect("memory").len(), 1);
    ix.check_invariants().unwrap();
}

#[test]
fn many_workers_and_removal() {
    let mut ix = index();
    for w in 0..130u64 {
        let hs: Vec<u64> = (0..=w % 7).collect();
        ix.apply(&format!("w{w}"), &[stored(&hs, None)], None, 0.0)
            .unwrap();
    }
    let m = ix
        .longest_prefix(&[0, 1, 2, 3, 4, 5, 6, 7], 0.0, None)
        .unwrap();
    for (i, &b) in m.blocks.iter().enumerate() {
        assert_eq!(u64::from(b), i as u64 % 7 + 1);
    }
    ix.remove_worker("w3").unwrap();
    ix.apply("w3", &[FleetEvent::Cleared], None, 0.0).unwrap();
    assert!(ix.cached_hashes("w3", None).unwrap().is_empty());
    ix.check_invariants().unwrap();
}

#[test]
fn wire_errors_leave_index_unchanged() {
    let mut ix = index();
    ix.apply("a", &[stored(&[1], None)], Some(0), 0.0).unwrap();
    let seq = 1u64.to_be_bytes();
    // [ts, [{"type": "Nope"}], 0]
    let payload = [
        0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x81, 0xa4, b't', b'y', b'p', b'e', 0xa4, b'N',
        b'o', b'p', b'e', 0x00,
    ];
    let err = ix
        .apply_frames("a", &[b"t", &seq, &payload], 0.0)
        .unwrap_err();
    assert!(err.to_string().contains("unknown event type"), "{err}");
    let err = ix
        .apply_frames("a", &[b"t", &seq, &payload[..5]], 0.0)
        .unwrap_err();
    assert!(err.to_string().contains("msgpack"), "{err}");
    let err = ix.apply_frames("a", &[b"t", &seq], 0.0).unwrap_err();
    assert!(err.to_string().contains("3 frames"), "{err}");
    let st = ix.status("a", 0.0).unwrap();
    assert_eq!((st.errors, st.next_seq), (3, 1));
    assert_eq!(ix.cached_hashes("a", None).unwrap(), vec![1]);
}

fn encode(v: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).unwrap();
    out
}

fn sample_payload() -> Vec<u8> {
    use rmpv::Value as V;
    let stored = V::Map(vec![
        (V::from("type"), V::from("BlockStored")),
        (
            V::from("block_hashes"),
            V::Array(vec![V::from(u64::MAX), V::from(3)]),
        ),
        (V::from("parent_block_hash"), V::Binary(vec![7; 32])),
        (
            V::from("token_ids"),
            V::Array((0..32u32).map(V::from).collect()),
        ),
        (V::from("block_size"), V::from(16)),
        (V::from("lora_id"), V::from(-4)),
        (V::from("medium"), V::from("CPU")),
        (
            V::from("cache_salt"),
            V::Map(vec![(V::from("x"), V::Array(vec![V::Nil]))]),
        ),
        (
            V::from("extra_keys"),
            V::Array(vec![V::Nil, V::Array(vec![V::from("a"), V::F32(1.0)])]),
        ),
        (V::from("group_idx"), V::from(1)),
    ]);
    let removed_array_form = V::Array(vec![
        V::from("BlockRemoved"),
        V::Array(vec![V::from(3)]),
        V::Nil,
    ]);
    let cleared = V::Map(vec![(V::from("type"), V::from("AllBlocksCleared"))]);
    encode(&V::Array(vec![
        V::F64(1.5),
        V::Array(vec![stored, removed_array_form, cleared]),
        V::from(2),
    ]))
}

#[test]
fn decodes_both_event_encodings_and_skips_unknown_fields() {
    let b = wire::decode_payload(&sample_payload(), HashForm::default()).unwrap();
    assert_eq!((b.ts, b.dp_rank, b.events.len()), (1.5, Some(2), 3));
    match &b.events[0] {
        FleetEvent::Stored(s) => {
            assert_eq!(s.block_hashes, vec![u64::MAX, 3]);
            assert_eq!(s.parent_block_hash, Some(0x0707_0707_0707_0707));
            assert_eq!((s.num_tokens, s.lora_id, s.group_idx), (32, Some(-4), 1));
            assert_eq!(s.medium.as_deref(), Some("CPU"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.events[1],
        FleetEvent::Removed {
            block_hashes: vec![3],
            medium: None,
            group_idx: 0
        }
    );
    assert_eq!(b.events[2], FleetEvent::Cleared);
}

#[test]
fn every_truncation_is_an_error() {
    let p = sample_payload();
    for n in 0..p.len() {
        let e = wire::decode_payload(&p[..n], HashForm::default()).unwrap_err();
        assert!(matches!(e, crate::Error::InvalidEvent(_)), "{n}: {e}");
    }
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
        let _ = wire::decode_payload(&bytes, HashForm::default());
    }

    #[test]
    fn corrupted_payloads_never_panic(pos in 0usize..400, byte in proptest::prelude::any::<u8>()) {
        let mut p = sample_payload();
        let i = pos % p.len();
        p[i] = byte;
        let _ = wire::decode_payload(&p, HashForm::default());
    }
}
