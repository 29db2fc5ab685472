//! Radix tree: arbitrary operation sequences, checked after every step against the
//! tree's own `check_invariants()` and a naive model.
//!
//! The model is the map `(namespace, page-aligned prefix) -> KV indices of its last
//! page`: a cached prefix set is closed under taking prefixes, `match_prefix` is the
//! longest prefix in the map, `insert` adds the missing pages, eviction removes whole
//! pages. Every inserted token gets a fresh index, so the multiset of indices in the tree
//! must equal the model's exactly (no index lost, duplicated or invented).
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use prefixcache_core::radix::{EvictionPolicy, Namespace, NodeRef, RadixTree};
use prefixcache_core::Error;

#[derive(Arbitrary, Debug)]
enum Op {
    Insert {
        ns: u8,
        key: Vec<u8>,
        priority: i8,
        inserted_len: u8,
        bad_values: bool,
    },
    Match {
        ns: u8,
        key: Vec<u8>,
    },
    Lock {
        handle: u8,
    },
    /// Unlock one of the locks this run holds.
    Unlock {
        lock: u8,
    },
    /// Unlock an arbitrary handle (may be unlocked or stale: must fail cleanly).
    UnlockAny {
        handle: u8,
    },
    Evict {
        n: i16,
    },
    Reset,
}

#[derive(Arbitrary, Debug)]
struct Input {
    page_size: u8,
    policy: u8,
    alphabet: u8,
    ops: Vec<Op>,
}

type Model = BTreeMap<(u8, Vec<u32>), Vec<i64>>;

/// Four namespace codes; code 3 (`extra_key="a"`, empty salt) is the same as code 1.
fn namespace(code: u8) -> (u8, Namespace) {
    match code % 4 {
        0 => (0, Namespace::new(None, None)),
        1 => (1, Namespace::new(Some("a"), None)),
        2 => (2, Namespace::new(None, Some("s"))),
        _ => (1, Namespace::new(Some("a"), Some(""))),
    }
}

fn canonical(ns: &Namespace) -> u8 {
    (0..3)
        .find(|&c| namespace(c).1 == *ns)
        .expect("unknown namespace in dump")
}

struct Handle {
    node: NodeRef,
    ns: u8,
    path: Vec<u32>,
    epoch: u32,
}

struct State {
    tree: RadixTree,
    page: usize,
    model: Model,
    handles: Vec<Handle>,
    /// Indices into `handles` of the locks held (one entry per successful lock).
    locks: Vec<usize>,
    epoch: u32,
    next_index: i64,
}

impl State {
    fn longest(&self, ns: u8, key: &[u32]) -> usize {
        let mut k = 0;
        while k + self.page <= key.len()
            && self
                .model
                .contains_key(&(ns, key[..k + self.page].to_vec()))
        {
            k += self.page;
        }
        k
    }

    fn model_path(&self, ns: u8, key: &[u32]) -> Vec<i64> {
        let mut out = Vec::new();
        let mut k = self.page;
        while k <= key.len() {
            out.extend_from_slice(&self.model[&(ns, key[..k].to_vec())]);
            k += self.page;
        }
        out
    }

    fn remember(&mut self, node: NodeRef, ns: u8, path: Vec<u32>) {
        if self.handles.len() < 64 {
            self.handles.push(Handle {
                node,
                ns,
                path,
                epoch: self.epoch,
            });
        }
    }

    /// The handle's node is alive iff its path is cached ... or a newer node took the path.
    fn check_handle(&self, h: &Handle) {
        match self.tree.path_indices(h.node) {
            Ok(ix) => {
                assert_eq!(
                    h.epoch, self.epoch,
                    "handle from before reset still resolves"
                );
                assert!(h.path.is_empty() || self.model.contains_key(&(h.ns, h.path.clone())));
                assert_eq!(ix, self.model_path(h.ns, &h.path), "handle path indices");
            }
            Err(Error::StaleHandle(_)) => {}
            Err(e) => panic!("path_indices: unexpected error {e:?}"),
        }
    }

    fn check(&self) {
        if let Err(e) = self.tree.check_invariants() {
            panic!("invariants: {e}");
        }
        // Rebuild the model from the dump.
        let mut rebuilt = Model::new();
        let mut stack: Vec<Vec<u32>> = Vec::new();
        let mut tokens = 0;
        for d in self.tree.dump() {
            stack.truncate(d.depth - 1);
            let mut path = stack.last().cloned().unwrap_or_default();
            assert_eq!(d.key.len() % self.page, 0, "node key not page aligned");
            assert_eq!(d.key.len(), d.value.len());
            assert!(!d.key.is_empty(), "empty non-root node");
            let ns = canonical(&d.namespace);
            for (kp, vp) in d.key.chunks(self.page).zip(d.value.chunks(self.page)) {
                path.extend_from_slice(kp);
                assert!(
                    rebuilt.insert((ns, path.clone()), vp.to_vec()).is_none(),
                    "duplicate path"
                );
            }
            tokens += d.key.len();
            stack.push(path);
        }
        assert_eq!(rebuilt, self.model, "tree contents differ from the model");
        assert_eq!(self.tree.total_size(), tokens);
        assert_eq!(
            self.tree.evictable_size() + self.tree.protected_size(),
            tokens
        );
        let mut all: Vec<i64> = self.model.values().flatten().copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "an index is cached twice");
        // Every held lock's node is alive.
        for &l in &self.locks {
            let h = &self.handles[l];
            assert!(
                self.tree.path_indices(h.node).is_ok(),
                "locked node vanished"
            );
        }
    }
}

fn tokens(raw: &[u8], alphabet: u8) -> Vec<u32> {
    let a = u32::from(alphabet % 6) + 2;
    raw.iter().take(48).map(|&b| u32::from(b) % a).collect()
}

fuzz_target!(|input: Input| {
    let page = usize::from(input.page_size % 4) + 1;
    let policy = EvictionPolicy::ALL[usize::from(input.policy) % EvictionPolicy::ALL.len()];
    let Ok(tree) = RadixTree::new(page, policy) else {
        panic!("new failed")
    };
    assert!(RadixTree::new(0, policy).is_err());
    let mut st = State {
        tree,
        page,
        model: Model::new(),
        handles: Vec::new(),
        locks: Vec::new(),
        epoch: 0,
        next_index: 0,
    };
    st.check();
    for op in input.ops.into_iter().take(200) {
        match op {
            Op::Insert {
                ns,
                key,
                priority,
                inserted_len,
                bad_values,
            } => {
                let (code, ns) = namespace(ns);
                let key = tokens(&key, input.alphabet);
                if bad_values {
                    let before = st.tree.dump();
                    let values = vec![0i64; key.len() + 1];
                    let r = st
                        .tree
                        .insert(&key, Some(&values), &ns, i64::from(priority), 0);
                    assert!(matches!(r, Err(Error::InvalidArgument(_))));
                    assert_eq!(before, st.tree.dump(), "failed insert changed the tree");
                    continue;
                }
                let values: Vec<i64> = (0..key.len() as i64).map(|i| st.next_index + i).collect();
                st.next_index += key.len() as i64;
                let aligned = key.len() - key.len() % page;
                let expect_prefix = st.longest(code, &key[..aligned]);
                let out = st
                    .tree
                    .insert(
                        &key,
                        Some(&values),
                        &ns,
                        i64::from(priority),
                        usize::from(inserted_len),
                    )
                    .expect("insert");
                assert_eq!(out.prefix_len, expect_prefix, "insert prefix_len");
                let mut k = expect_prefix + page;
                while k <= aligned {
                    st.model
                        .insert((code, key[..k].to_vec()), values[k - page..k].to_vec());
                    k += page;
                }
                assert_eq!(st.tree.path_len(out.node).expect("path_len"), aligned);
                assert_eq!(
                    st.tree.path_indices(out.node).expect("path"),
                    st.model_path(code, &key[..aligned])
                );
                st.remember(out.node, code, key[..aligned].to_vec());
            }
            Op::Match { ns, key } => {
                let (code, ns) = namespace(ns);
                let key = tokens(&key, input.alphabet);
                let expect = st.longest(code, &key);
                let out = st.tree.match_prefix(&key, &ns).expect("match_prefix");
                assert_eq!(out.length, expect, "match length");
                assert_eq!(st.tree.path_len(out.node).expect("path_len"), expect);
                assert_eq!(
                    st.tree.path_indices(out.node).expect("path"),
                    st.model_path(code, &key[..expect])
                );
                st.remember(out.node, code, key[..expect].to_vec());
            }
            Op::Lock { handle } => {
                if st.handles.is_empty() {
                    continue;
                }
                let i = usize::from(handle) % st.handles.len();
                let before = st.tree.dump();
                let ev = st.tree.evictable_size();
                match st.tree.inc_lock_ref(st.handles[i].node) {
                    Ok(delta) => {
                        assert!(delta <= 0);
                        assert_eq!(st.tree.evictable_size() as i64, ev as i64 + delta);
                        if !st.handles[i].path.is_empty() {
                            st.locks.push(i);
                        }
                    }
                    Err(Error::StaleHandle(_) | Error::LockRef(_)) => {
                        assert_eq!(before, st.tree.dump(), "failed lock changed the tree");
                    }
                    Err(e) => panic!("lock: {e:?}"),
                }
            }
            Op::Unlock { lock } => {
                if st.locks.is_empty() {
                    continue;
                }
                let i = st.locks.swap_remove(usize::from(lock) % st.locks.len());
                let ev = st.tree.evictable_size();
                let delta = st
                    .tree
                    .dec_lock_ref(st.handles[i].node)
                    .expect("unlock of a held lock");
                assert!(delta >= 0);
                assert_eq!(st.tree.evictable_size() as i64, ev as i64 + delta);
            }
            Op::UnlockAny { handle } => {
                if st.handles.is_empty() {
                    continue;
                }
                let i = usize::from(handle) % st.handles.len();
                let before = st.tree.dump();
                match st.tree.dec_lock_ref(st.handles[i].node) {
                    // Succeeded: it consumed one of our locks on some node of the path;
                    // we cannot tell which, so put it back to keep the bookkeeping exact.
                    Ok(_) => {
                        st.tree.inc_lock_ref(st.handles[i].node).expect("relock");
                        assert_eq!(before, st.tree.dump(), "unlock+lock is not the identity");
                    }
                    Err(Error::StaleHandle(_) | Error::LockRef(_)) => {
                        assert_eq!(before, st.tree.dump(), "failed unlock changed the tree");
                    }
                    Err(e) => panic!("unlock: {e:?}"),
                }
            }
            Op::Evict { n } => {
                let before = st.tree.dump();
                let ev = st.tree.evictable_size();
                match st.tree.evict(i64::from(n)) {
                    Err(Error::InvalidArgument(_)) if n < 0 => {
                        assert_eq!(before, st.tree.dump(), "failed evict changed the tree");
                    }
                    Ok(freed) => {
                        assert!(n >= 0);
                        let want = usize::try_from(n).unwrap_or(0);
                        assert!(
                            freed.len() >= want
                                || st.tree.evictable_size() == 0
                                || st.tree.num_evictable_leaves() == 0
                        );
                        assert_eq!(st.tree.evictable_size(), ev - freed.len());
                        let freed: BTreeSet<i64> = freed.into_iter().collect();
                        let mut gone = 0;
                        st.model.retain(|_, v| {
                            let hit = v.iter().filter(|x| freed.contains(x)).count();
                            assert!(hit == 0 || hit == v.len(), "eviction split a page");
                            gone += hit;
                            hit == 0
                        });
                        assert_eq!(gone, freed.len(), "evicted an index that was not cached");
                        for (ns, path) in st.model.keys() {
                            if path.len() > page {
                                assert!(
                                    st.model
                                        .contains_key(&(*ns, path[..path.len() - page].to_vec())),
                                    "eviction left an orphan"
                                );
                            }
                        }
                    }
                    Err(e) => panic!("evict({n}): {e:?}"),
                }
            }
            Op::Reset => {
                st.tree.reset();
                st.model.clear();
                st.locks.clear();
                st.epoch += 1;
            }
        }
        st.check();
        for h in &st.handles {
            st.check_handle(h);
        }
    }
});
