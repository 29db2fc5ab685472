//! A full consistency check of the tree, for tests and fuzzing (O(size of the tree)).

use super::children::{child_key, UNLISTED};
use super::tree::{Namespace, RadixTree, NO_PARENT, ROOT};

impl RadixTree {
    /// Checks every structural invariant; returns a description of the first violation.
    ///
    /// - each live node is filed under its parent by its child key, parents point back;
    /// - node keys and values have equal, page-aligned, non-zero lengths;
    /// - a node's lock count is at least the sum of its children's;
    /// - evictable + protected sizes add up to the tokens held, split by lock state;
    /// - the evictable set holds exactly the unlocked childless non-root nodes (with a
    ///   host tier: unlocked device nodes without device children), each under its
    ///   current policy key;
    /// - the side table of heap positions holds exactly the listed nodes that have
    ///   children, each with its true position.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut evictable = 0usize;
        let mut protected = 0usize;
        let mut live = 0usize;
        let mut leaves = 0usize;
        let mut listed_with_children = 0usize;
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
            let evicted = self.is_evicted(slot);
            if evicted {
                // Host-only: no device KV (host.rs checks the host side).
            } else if n.lock_ref == 0 {
                evictable += len;
            } else {
                protected += len;
            }
            let should_list = n.lock_ref == 0 && !evicted && !self.has_device_children(slot);
            let listed = self.listed(slot);
            if should_list != listed {
                return Err(format!(
                    "node {slot}: listed={listed} but evictable={should_list}"
                ));
            }
            if should_list {
                leaves += 1;
                if self.evictable.get(self.heap_pos(slot) as usize) != Some(&slot) {
                    return Err(format!("node {slot} is not at its heap position"));
                }
                if !n.children.is_empty() {
                    listed_with_children += 1;
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
        for (&slot, &pos) in &self.heap_side {
            let Some(n) = self.nodes.get(slot as usize) else {
                return Err(format!("heap side table: slot {slot} out of range"));
            };
            if slot == ROOT || n.parent == NO_PARENT {
                return Err(format!("heap side table: node {slot} is not a live node"));
            }
            if n.children.is_empty() {
                return Err(format!(
                    "heap side table: node {slot} is childless (its position belongs in \
                     its words)"
                ));
            }
            if pos == UNLISTED || self.evictable.get(pos as usize) != Some(&slot) {
                return Err(format!(
                    "heap side table: node {slot} at position {pos}, not there in the heap"
                ));
            }
        }
        if listed_with_children != self.heap_side.len() {
            return Err(format!(
                "{listed_with_children} listed nodes have children but the heap side table \
                 holds {}",
                self.heap_side.len()
            ));
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
        self.check_namespace_invariants()?;
        self.check_host_invariants()
    }

    /// Every interned namespace maps to its own entry, every other entry is free (once),
    /// and "no namespace" is always interned as id 0.
    fn check_namespace_invariants(&self) -> Result<(), String> {
        if self.namespace_ids.get(&Namespace::default()) != Some(&0) {
            return Err("\"no namespace\" is not interned as id 0".into());
        }
        for (ns, &id) in &self.namespace_ids {
            if self.namespaces.get(id as usize).map(|e| &e.0) != Some(ns) {
                return Err(format!("namespace id {id} does not hold {ns:?}"));
            }
        }
        let mut free = self.free_namespaces.clone();
        free.sort_unstable();
        free.dedup();
        if free.len() != self.free_namespaces.len()
            || free
                .iter()
                .any(|&id| id == 0 || id as usize >= self.namespaces.len())
            || self.namespace_ids.len() + free.len() != self.namespaces.len()
        {
            return Err(format!(
                "{} namespaces interned and {} free ids ({free:?}) for {} entries",
                self.namespace_ids.len(),
                self.free_namespaces.len(),
                self.namespaces.len()
            ));
        }
        Ok(())
    }
}
