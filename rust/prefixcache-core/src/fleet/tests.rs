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
    let w = &m.workers[0];
    assert_eq!(&*m.media[0], "GPU");
    assert_eq!(w.per_medium.as_slice(), &[1, 2]);
    // Block 2 is only on CPU, blocks 1 and 3 on GPU: all three are held on some medium.
    assert_eq!(w.blocks, 3);
    let weighted = ix
        .longest_prefix(&[1, 2, 3], 0.0, Some(&[("CPU".into(), 0.5)]))
        .unwrap();
    assert_eq!(weighted.workers[0].score, 2.5);
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
    assert_eq!(
        ix.apply("a", &[stored(&[7], None)], Some(0), 0.0).unwrap(),
        ApplyOutcome::Applied
    );
    assert_eq!(ix.cached_hashes("a", None).unwrap(), vec![7]);
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
    assert_eq!(ix.prune_expired(12.0).len(), 1);
    assert_eq!(ix.workers().len(), 1);
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
    for (i, w) in m.workers.iter().enumerate() {
        assert_eq!(u64::from(w.blocks), i as u64 % 7 + 1);
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
