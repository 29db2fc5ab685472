//! A full consistency check of the tree, for tests and fuzzing (O(size of the tree)).

use super::children::child_key;
use super::tree::{RadixTree, ROOT};

impl RadixTree {
    /// Checks every structural invariant; returns a description of the first violation.
    ///
    /// - each live node is filed under its parent by its child key, parents point back;
    /// - node keys and values have equal, page-aligned, non-zero lengths;
    /// - a node's lock count is at least the sum of its children's;
    /// - evictable + protected sizes add up to the tokens held, split by lock state;
    /// - the evictable set holds exactly the unlocked childless non-root nodes, each under
    ///   its current policy key.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut evictable = 0usize;
        let mut protected = 0usize;
        let mut live = 0usize;
        let mut leaves = 0usize;
        let mut stack = vec![ROOT];
        while let Some(slot) = stack.pop() {
            let n = &self.nodes[slot as usize];
            let mut child_locks = 0u64;
            for c in n.children.ids(&self.indexes) {
                let cn = &self.nodes[c as usize];
                if cn.parent != slot {
                    return Err(format!(
                        "node {c} is filed under {slot} but its parent is {}",
                        cn.parent
                    ));
                }
                if cn.span.len() == 0
                    || !n
                        .children
                        .candidates(child_key(self.ns(c), cn.span.key()[0]), &self.indexes)
                        .any(|x| x == c)
                {
                    return Err(format!("node {c} is not filed under its child key"));
                }
                if slot != ROOT && self.ns(c) != self.ns(slot) {
                    return Err(format!("node {c} is in another namespace than its parent"));
                }
                child_locks += u64::from(cn.lock_ref);
                stack.push(c);
            }
            if slot == ROOT {
                continue;
            }
            live += 1;
            let len = n.span.len();
            if len != n.span.values().len() || len == 0 || len % self.page_size != 0 {
                return Err(format!(
                    "node {slot} has key length {len} and value length {}",
                    n.span.values().len()
                ));
            }
            if u64::from(n.lock_ref) < child_locks {
                return Err(format!(
                    "node {slot} lock_ref {} < its children's {child_locks}",
                    n.lock_ref
                ));
            }
            if n.lock_ref == 0 {
                evictable += len;
            } else {
                protected += len;
            }
            let should_list = n.lock_ref == 0 && n.children.is_empty();
            if should_list != n.listed() {
                return Err(format!(
                    "node {slot}: listed={} but evictable={should_list}",
                    n.listed()
                ));
            }
            if should_list {
                leaves += 1;
                if self.evictable.get(n.children.heap_pos() as usize) != Some(&slot) {
                    return Err(format!("node {slot} is not at its heap position"));
                }
            }
        }
        if live != self.num_nodes {
            return Err(format!(
                "{live} live nodes but num_nodes = {}",
                self.num_nodes
            ));
        }
        for i in 1..self.evictable.len() {
            let (c, p) = (self.evictable[i], self.evictable[(i - 1) / 2]);
            if self.policy_key(c) <= self.policy_key(p) {
                return Err(format!("evictable heap out of order at position {i}"));
            }
        }
        if leaves != self.evictable.len() {
            return Err(format!(
                "{leaves} evictable leaves but the set holds {}",
                self.evictable.len()
            ));
        }
        if evictable != self.evictable_size || protected != self.protected_size {
            return Err(format!(
                "sizes: counted evictable {evictable} protected {protected}, recorded {} {}",
                self.evictable_size, self.protected_size
            ));
        }
        Ok(())
    }
}
