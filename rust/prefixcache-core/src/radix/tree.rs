//! The radix tree: node arena, match / insert / split, locks and sizes.
//!
//! Nodes live in a `Vec` addressed by u32 slots, recycled through a free list. A handle
//! ([`NodeRef`]) carries the tree's id and the node's unique serial, so a handle to an
//! evicted, reset or foreign node is detected instead of aliasing a new node.
//!
//! Time is logical: every `match_prefix` / `insert` call advances the clock by one and
//! stamps every node it touches with that value.

use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::FxHashMap;

use super::children::{child_key, Indexes};
use super::host::HostTier;
use super::node::{shrink_map, Node, Sides, Stamps};
use super::policy::EvictionPolicy;
use super::slab::Slab;
use super::span::Span;
use crate::error::try_copy_str;
use crate::{Error, Result};

pub(crate) const ROOT: u32 = 0;
pub(crate) const NO_PARENT: u32 = u32::MAX;

static NEXT_TREE_ID: AtomicU64 = AtomicU64::new(1);

/// A handle to a node: valid while the node exists in the tree that issued it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeRef {
    pub tree: u64,
    pub slot: u32,
    pub serial: u64,
}

/// A namespace: `(extra_key, cache_salt)`, kept structured (never concatenated).
/// An empty cache salt is the same as none.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Namespace {
    pub extra_key: Option<String>,
    pub cache_salt: Option<String>,
}

impl Namespace {
    pub fn new(extra_key: Option<&str>, cache_salt: Option<&str>) -> Self {
        Namespace {
            extra_key: extra_key.map(str::to_owned),
            cache_salt: cache_salt.filter(|s| !s.is_empty()).map(str::to_owned),
        }
    }

    /// A copy, or an `OutOfMemory` error when its strings cannot be allocated.
    fn try_clone(&self) -> Result<Self> {
        let copy = |s: &Option<String>| {
            s.as_deref()
                .map(|s| try_copy_str(s, "a namespace"))
                .transpose()
        };
        Ok(Namespace {
            extra_key: copy(&self.extra_key)?,
            cache_salt: copy(&self.cache_salt)?,
        })
    }

    fn sort_key(&self) -> (bool, &str, bool, &str) {
        (
            self.extra_key.is_some(),
            self.extra_key.as_deref().unwrap_or(""),
            self.cache_salt.is_some(),
            self.cache_salt.as_deref().unwrap_or(""),
        )
    }
}

/// Result of [`RadixTree::match_prefix`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchOutcome {
    /// Matched tokens on the device (a multiple of the page size).
    pub length: usize,
    /// The last device node of the matched path (the root when nothing matched).
    pub node: NodeRef,
    /// Matched tokens beyond `length` that are only in host memory (0 without a host
    /// tier; SGLang `host_hit_length`).
    pub host_length: usize,
    /// The last node of the whole matched path, host part included (SGLang
    /// `last_host_node`; `node` when `host_length` is 0).
    pub host_node: NodeRef,
}

/// Result of [`RadixTree::insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertOutcome {
    /// Tokens that were already cached on the device (their values were kept, not
    /// replaced). Host-only nodes on the path take the inserted values instead.
    pub prefix_len: usize,
    /// The last node of the inserted key's path.
    pub node: NodeRef,
}

/// Inspection of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    pub length: usize,
    pub lock_ref: u64,
    pub hit_count: u64,
    pub priority: i64,
    pub last_access_time: u64,
    pub creation_time: u64,
    pub num_children: usize,
    pub is_root: bool,
    pub namespace: Namespace,
}

/// One node in [`RadixTree::dump`] (canonical order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeDump {
    pub depth: usize,
    pub key: Vec<u32>,
    pub value: Vec<i64>,
    pub lock_ref: u64,
    pub hit_count: u64,
    pub priority: i64,
    pub last_access_time: u64,
    pub creation_time: u64,
    pub namespace: Namespace,
}

/// SGLang's RadixCache over token ids (u32) and KV indices (i64).
#[derive(Debug)]
pub struct RadixTree {
    pub(crate) id: u64,
    pub(crate) page_size: usize,
    pub(crate) policy: EvictionPolicy,
    pub(crate) nodes: Slab<Node>,
    /// What does not fit in the nodes: wide stamps, priorities, large namespace ids.
    pub(crate) sides: Sides,
    /// The child indexes of nodes with many children.
    pub(crate) indexes: Indexes,
    pub(crate) free_slots: Vec<u32>,
    pub(crate) next_serial: u64,
    pub(crate) clock: u64,
    pub(crate) evictable_size: usize,
    pub(crate) protected_size: usize,
    pub(crate) num_nodes: usize,
    /// Evictable leaves: a binary min-heap of slots ordered by policy key (which ends
    /// with the serial: unique), each node holding its position ([`RadixTree::heap_pos`]).
    pub(crate) evictable: Vec<u32>,
    /// Heap positions of listed nodes that have children (with a host tier, a device leaf
    /// whose children are all host-only); a childless node keeps its position in its
    /// child index's words. Empty without a host tier.
    pub(crate) heap_side: FxHashMap<u32, u32>,
    /// Interned namespaces by id, with the number of live nodes in each: a namespace is
    /// dropped with its last node (id 0, no namespace, is permanent), so memory follows
    /// what is cached, not every namespace ever seen.
    pub(crate) namespaces: Vec<(Namespace, usize)>,
    pub(crate) namespace_ids: FxHashMap<Namespace, u32>,
    /// Ids of dropped namespaces, reused first.
    pub(crate) free_namespaces: Vec<u32>,
    /// The HiCache host tier, if any (host.rs).
    pub(crate) host: Option<Box<HostTier>>,
}

/// Length of the common prefix of `a` and `b`.
///
/// Whole-slice equality first (one vectorised memcmp: the common case is a full match of
/// a node's key), then 64-token chunks, then single tokens.
#[inline]
pub(crate) fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    const CHUNK: usize = 64;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    if a == b {
        return n;
    }
    let mut i = 0;
    while i + CHUNK <= n && a[i..i + CHUNK] == b[i..i + CHUNK] {
        i += CHUNK;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

impl RadixTree {
    pub fn new(page_size: usize, policy: EvictionPolicy) -> Result<Self> {
        if page_size == 0 {
            return Err(Error::InvalidArgument(
                "page_size must be >= 1, got 0".into(),
            ));
        }
        let mut tree = RadixTree {
            id: NEXT_TREE_ID.fetch_add(1, Ordering::Relaxed),
            page_size,
            policy,
            nodes: Slab::default(),
            sides: Sides::default(),
            indexes: Indexes::default(),
            free_slots: Vec::new(),
            next_serial: 0,
            clock: 0,
            evictable_size: 0,
            protected_size: 0,
            num_nodes: 0,
            evictable: Vec::new(),
            heap_side: FxHashMap::default(),
            namespaces: Vec::new(),
            namespace_ids: FxHashMap::default(),
            free_namespaces: Vec::new(),
            host: None,
        };
        tree.reset();
        Ok(tree)
    }

    /// Empties the tree. Every handle issued before becomes stale; the clock and the
    /// serial counter keep running.
    pub fn reset(&mut self) {
        // Fresh containers: the memory of what was cached goes back to the allocator.
        self.nodes = Slab::default();
        self.indexes = Indexes::default();
        self.sides.reset(self.clock, self.next_serial);
        self.free_slots = Vec::new();
        self.evictable = Vec::new();
        self.heap_side = FxHashMap::default();
        let none = Namespace::default();
        self.namespace_ids = FxHashMap::default();
        self.namespace_ids.insert(none.clone(), 0);
        self.namespaces = vec![(none, 0)];
        self.free_namespaces = Vec::new();
        self.evictable_size = 0;
        self.protected_size = 0;
        self.num_nodes = 0;
        let serial = self.take_serial();
        let mut root = Node::new(NO_PARENT);
        root.lock_ref = 1;
        self.nodes.push(root);
        let now = self.clock;
        self.set_stamps(ROOT, Stamps::new(serial, now, now));
        self.set_priority(ROOT, i64::MIN);
        self.host_on_reset();
        // A new id, so that handles from before the reset can never alias new nodes.
        self.id = NEXT_TREE_ID.fetch_add(1, Ordering::Relaxed);
    }

    #[inline(always)]
    fn take_serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.rebase_if_needed(self.clock, s);
        self.next_serial += 1;
        s
    }

    pub fn page_size(&self) -> usize {
        self.page_size
    }
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }
    pub fn clock(&self) -> u64 {
        self.clock
    }
    pub fn evictable_size(&self) -> usize {
        self.evictable_size
    }
    pub fn protected_size(&self) -> usize {
        self.protected_size
    }
    pub fn total_size(&self) -> usize {
        self.evictable_size + self.protected_size
    }
    /// Live nodes, the root excluded.
    pub fn num_nodes(&self) -> usize {
        self.num_nodes
    }
    pub fn root(&self) -> NodeRef {
        self.handle(ROOT)
    }

    pub(crate) fn handle(&self, slot: u32) -> NodeRef {
        NodeRef {
            tree: self.id,
            slot,
            serial: self.serial(slot),
        }
    }

    /// The slot of a live node, or `StaleHandle`.
    pub fn resolve(&self, node: NodeRef) -> Result<u32> {
        if node.tree != self.id {
            return Err(Error::StaleHandle(
                "stale node handle: it belongs to another RadixCache or to this one before reset()"
                    .into(),
            ));
        }
        match self.nodes.get(node.slot as usize) {
            Some(n)
                if (node.slot == ROOT || n.parent != NO_PARENT)
                    && self.serial(node.slot) == node.serial =>
            {
                Ok(node.slot)
            }
            _ => Err(Error::StaleHandle(
                "stale node handle: the node was evicted".into(),
            )),
        }
    }

    fn namespace_id(&self, ns: &Namespace) -> Option<u32> {
        self.namespace_ids.get(ns).copied()
    }

    /// The id of `ns`, interning it (with no node yet) when new. An insert that ends up
    /// creating no node in it drops it again ([`RadixTree::drop_unused_namespace`]).
    /// Allocates everything first: without memory, an `OutOfMemory` error and no change.
    fn intern_namespace(&mut self, ns: &Namespace) -> Result<u32> {
        if let Some(id) = self.namespace_ids.get(ns) {
            return Ok(*id);
        }
        let oom = |e| Error::out_of_memory("a namespace", e);
        let (a, b) = (ns.try_clone()?, ns.try_clone()?);
        self.namespace_ids.try_reserve(1).map_err(oom)?;
        if self.free_namespaces.is_empty() {
            self.namespaces.try_reserve(1).map_err(oom)?;
            // Dropping a namespace files its id without allocating.
            let want = self.namespaces.len() + 1;
            self.free_namespaces
                .try_reserve(want.saturating_sub(self.free_namespaces.len()))
                .map_err(oom)?;
        }
        let id = match self.free_namespaces.pop() {
            Some(id) => {
                self.namespaces[id as usize] = (a, 0);
                id
            }
            None => {
                self.namespaces.push((a, 0));
                (self.namespaces.len() - 1) as u32
            }
        };
        self.namespace_ids.insert(b, id);
        Ok(id)
    }

    /// Forgets namespace `id` when no node is in it (never namespace 0, no namespace).
    fn drop_unused_namespace(&mut self, id: u32) {
        if id == 0 || self.namespaces.get(id as usize).is_none_or(|e| e.1 != 0) {
            return;
        }
        let (ns, _) = std::mem::take(&mut self.namespaces[id as usize]);
        self.namespace_ids.remove(&ns);
        self.free_namespaces.push(id);
        if self.namespace_ids.len() * 4 < self.namespace_ids.capacity() {
            shrink_map(&mut self.namespace_ids, 0);
        }
    }

    /// Number of namespaces with at least one node (plus "no namespace", always kept).
    pub fn num_namespaces(&self) -> usize {
        self.namespace_ids.len()
    }

    fn aligned(&self, len: usize) -> usize {
        len - len % self.page_size
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.rebase_if_needed(self.clock, self.next_serial);
        self.clock
    }

    /// The child of `node` whose child key matches the start of `key` (non-empty, aligned).
    #[inline(always)]
    fn find_child(&self, node: u32, ns: u32, key: &[u32]) -> Option<u32> {
        let n = &self.nodes[node as usize];
        let ck = child_key(ns, key[0]);
        let page = &key[..self.page_size];
        // Below the root every node is in its parent's namespace (only the root's
        // children need their namespace checked).
        let matches = |c: u32| {
            let k = self.nodes[c as usize].span.key();
            let same = if page.len() == 1 {
                k.first() == Some(&page[0])
            } else {
                k.get(..page.len()) == Some(page)
            };
            same && (node != ROOT || self.ns(c) == ns)
        };
        match n.children.few_slots() {
            Some(few) => few.iter().copied().find(|&c| matches(c)),
            None => n
                .children
                .candidates(ck, &self.indexes)
                .find(|&c| matches(c)),
        }
    }

    /// The child key a node is filed under in its parent's index.
    pub(crate) fn child_key_of(&self, slot: u32) -> u64 {
        let n = &self.nodes[slot as usize];
        child_key(self.ns(slot), n.span.key().first().copied().unwrap_or(0))
    }

    /// Makes room for a node with these stamps, priority and namespace, so that
    /// [`RadixTree::alloc`] and the setters after it allocate nothing: without memory an
    /// `OutOfMemory` error, and nothing the tree holds changes.
    fn reserve_node(&mut self, stamps: &Stamps, priority: i64, ns: u32) -> Result<()> {
        let oom = |e| Error::out_of_memory("a radix node", e);
        if self.free_slots.is_empty() {
            self.nodes.try_reserve_one().map_err(oom)?;
        }
        self.host_reserve()?;
        self.reserve_sides(stamps, priority, ns)
    }

    /// Places `node` in a slot with its namespace and stamps (after
    /// [`RadixTree::reserve_node`], without allocating).
    fn alloc(&mut self, node: Node, ns: u32, stamps: Stamps) -> u32 {
        self.num_nodes += 1;
        if let Some(e) = self.namespaces.get_mut(ns as usize) {
            e.1 += 1;
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.nodes[slot as usize] = node;
                slot
            }
            None => {
                self.nodes.push(node);
                (self.nodes.len() - 1) as u32
            }
        };
        self.set_ns(slot, ns);
        self.set_stamps(slot, stamps);
        self.host_on_alloc(slot);
        slot
    }

    pub(crate) fn release(&mut self, slot: u32) {
        debug_assert!(
            !self.listed(slot),
            "release: node {slot} is in the evictable set"
        );
        let ns = self.ns(slot);
        self.forget_sides(slot);
        let n = &mut self.nodes[slot as usize];
        n.parent = NO_PARENT;
        n.span = Span::default();
        n.children.clear(&mut self.indexes);
        // Without memory to file it, the cleared slot is left unused (until a reset)
        // rather than aborting an eviction.
        if self.free_slots.try_reserve(1).is_ok() {
            self.free_slots.push(slot);
        }
        self.num_nodes -= 1;
        self.host_on_release(slot);
        if let Some(e) = self.namespaces.get_mut(ns as usize) {
            e.1 -= 1;
        }
        self.drop_unused_namespace(ns);
    }

    /// Splits `child` after `p` tokens (0 < p < its length): a new node takes the first
    /// `p` tokens and becomes the child's parent. The original node keeps the tail (so its
    /// handles stay valid). When the halves' memory cannot be allocated, an `OutOfMemory`
    /// error and no change.
    fn split(&mut self, child: u32, p: usize, now: u64) -> Result<u32> {
        let ns = self.ns(child);
        let from = self.stamps(child);
        let priority = self.priority(child);
        let stamps = Stamps {
            serial: self.next_serial,
            last_access: now,
            ..from
        };
        self.reserve_node(&stamps, priority, ns)?;
        // Both halves get exact-size buffers: a split must not leave the head holding the
        // whole original capacity (memory per cached token is a target).
        let (head, tail) = self.nodes[child as usize].span.split_at(p)?;
        let host_parts = self.host_prepare_split(child, p)?;
        let serial = self.take_serial();
        debug_assert_eq!(serial, stamps.serial);
        let c = &mut self.nodes[child as usize];
        let parent = c.parent;
        c.span.replace(tail);
        let mut new = Node::new(parent);
        new.lock_ref = c.lock_ref;
        let ck = child_key(ns, head.key()[0]);
        new.span = head;
        // The new node has no child yet: no key to read.
        new.children.insert_first(child);
        let new_slot = self.alloc(new, ns, stamps);
        self.set_priority(new_slot, priority);
        self.host_on_split(child, new_slot, host_parts);
        self.nodes[child as usize].parent = new_slot;
        let replaced =
            self.nodes[parent as usize]
                .children
                .replace(ck, child, new_slot, &mut self.indexes);
        debug_assert!(replaced, "split: child not filed under its parent");
        Ok(new_slot)
    }

    /// Sets the last access time of `node`, keeping the evictable set in order.
    #[inline]
    fn touch(&mut self, node: u32, now: u64) {
        if self.listed(node) {
            self.unlist(node);
            self.set_last_access(node, now);
            self.relist(node);
        } else {
            self.set_last_access(node, now);
            if self.host.is_some() {
                self.host_offer(node);
            }
        }
    }

    /// Longest cached prefix of `key` in namespace `ns` (SEMANTICS.md 1.3). May split a
    /// node; an `OutOfMemory` error when the split's memory cannot be allocated (the nodes
    /// walked before it keep their new access time).
    pub fn match_prefix(&mut self, key: &[u32], ns: &Namespace) -> Result<MatchOutcome> {
        let now = self.tick();
        let key = &key[..self.aligned(key.len())];
        let root = self.root();
        let nothing = MatchOutcome {
            length: 0,
            node: root,
            host_length: 0,
            host_node: root,
        };
        if key.is_empty() {
            return Ok(nothing);
        }
        self.set_last_access(ROOT, now);
        let Some(ns) = self.namespace_id(ns) else {
            return Ok(nothing);
        };
        let mut node = ROOT;
        let mut matched = 0;
        let mut rest = key;
        // The device part ends at the first host-only node (device nodes are a prefix).
        let mut device: Option<(u32, usize)> = None;
        while !rest.is_empty() {
            let Some(child) = self.find_child(node, ns, rest) else {
                break;
            };
            if device.is_none() && self.is_evicted(child) {
                device = Some((node, matched));
            }
            self.touch(child, now);
            let c = &self.nodes[child as usize];
            let p = self.aligned(common_prefix_len(c.span.key(), rest));
            if p == 0 {
                // find_child matched the first page, so only a key rewritten during the
                // call (a caller's array read in place, written by another thread) gets
                // here: stop rather than split off nothing.
                break;
            }
            matched += p;
            if p < c.span.len() {
                node = self.split(child, p, now)?;
                break;
            }
            node = child;
            rest = &rest[p..];
        }
        let (dev_node, dev_len) = device.unwrap_or((node, matched));
        Ok(MatchOutcome {
            length: dev_len,
            node: self.handle(dev_node),
            host_length: matched - dev_len,
            host_node: self.handle(node),
        })
    }

    /// Inserts `key` with KV indices `value` (default: the tokens themselves) in namespace
    /// `ns` (SEMANTICS.md 1.5). Existing values are never replaced.
    pub fn insert(
        &mut self,
        key: &[u32],
        value: Option<&[i64]>,
        ns: &Namespace,
        priority: i64,
        inserted_len: usize,
    ) -> Result<InsertOutcome> {
        if let Some(v) = value {
            if v.len() != key.len() {
                return Err(Error::InvalidArgument(format!(
                    "values has length {} but tokens has length {}: they must be equal",
                    v.len(),
                    key.len()
                )));
            }
        }
        let now = self.tick();
        let key = &key[..self.aligned(key.len())];
        self.set_last_access(ROOT, now);
        self.raise_priority(ROOT, priority);
        if key.is_empty() {
            return Ok(InsertOutcome {
                prefix_len: 0,
                node: self.root(),
            });
        }
        let ns = self.intern_namespace(ns)?;
        let mut node = ROOT;
        let mut total = 0;
        let mut rest = key;
        let counts_hits = self.counts_hits();
        // Without a host tier the path's hits and priorities change only once the call
        // can no longer fail (`path_done`); before that, an allocation that fails leaves
        // what the tree caches as it was (a split keeps it; access times may advance).
        let deferred = self.host.is_none();
        // Host tier: the device part of the path, and the nodes to back up afterwards.
        let mut device_prefix: Option<usize> = None;
        let mut backups: Vec<u32> = Vec::new();
        // Host-only nodes of the path with the device KV the insert gives them, top-down.
        let mut revives: Vec<(u32, Span)> = Vec::new();
        while !rest.is_empty() {
            let Some(child) = self.find_child(node, ns, rest) else {
                break;
            };
            let listed = self.listed(child);
            if listed {
                self.unlist(child);
            }
            let page = self.page_size;
            self.set_last_access(child, now);
            if self.host.is_some() {
                // A host-only leaf just took a new key: its host-order entry, in case
                // the call fails before the node is back on the device.
                self.host_offer(child);
            }
            let c = &self.nodes[child as usize];
            let common = common_prefix_len(c.span.key(), rest);
            let p = common - common % page;
            total += p;
            rest = &rest[p..];
            node = if p < c.span.len() {
                if listed {
                    self.relist(child);
                }
                self.split(child, p, now)?
            } else {
                child
            };
            let counted = total > inserted_len && counts_hits;
            if !deferred {
                self.raise_priority(node, priority);
                if counted {
                    self.add_hit(node);
                }
            }
            if listed && node == child {
                self.relist(child);
            }
            if self.host.is_some() {
                // A host-only leaf keeps its host-order entry with its new key: the tail
                // of a split with the new access time, or the whole node with the hit and
                // priority just counted (it is on the device again only once the call
                // can no longer fail).
                self.host_offer(child);
                if self.is_evicted(node) {
                    // A host-only node takes the inserted KV (SGLang
                    // `_unevict_node_on_insert`): it is on the device again, once the
                    // call can no longer fail (its KV is made now).
                    let start = total - p;
                    device_prefix.get_or_insert(start);
                    let span = match value {
                        Some(v) => Span::from_values(&key[start..total], &v[start..total]),
                        None => Span::from_tokens(&key[start..total]),
                    };
                    let taken = span.and_then(|span| {
                        revives
                            .try_reserve(1)
                            .map_err(|e| Error::out_of_memory("an insert's host-only path", e))
                            .map(|()| revives.push((node, span)))
                    });
                    if let Err(e) = taken {
                        self.drop_unused_namespace(ns);
                        return Err(e);
                    }
                }
                if counted && self.wants_backup(node) {
                    if let Err(e) = backups.try_reserve(1) {
                        self.drop_unused_namespace(ns);
                        return Err(Error::out_of_memory("an insert's backups", e));
                    }
                    backups.push(node);
                }
            }
        }
        let path_end = node;
        if deferred {
            // Room for what the path's nodes take in the side tables (`path_done`): new
            // priorities, and stamps that one more hit widens; a `try_reserve` counts from
            // the table's length, so the new leaf's entry is counted here too.
            let leaf = usize::from(!rest.is_empty());
            let mut room = Ok(());
            if priority > 0 {
                let raised = self.count_path(node, |t, n| !t.has_side_priority(n));
                room = self.reserve_priorities(raised + leaf);
            }
            if counts_hits && room.is_ok() && self.hits_may_widen() {
                let widened = self.count_path(node, |t, n| t.hit_widens(n));
                if widened > 0 {
                    room = self.reserve_wide(widened + leaf);
                }
            }
            if let Err(e) = room {
                self.drop_unused_namespace(ns);
                return Err(e);
            }
        }
        // The host copies of the backups to come (with the values kept), made while a
        // failure still leaves what the tree caches as it was: once the leaf exists
        // nothing may fail.
        let offset = key.len() - rest.len();
        let leaf_hits = u64::from(total + rest.len() > inserted_len && counts_hits);
        let leaf_copy = (!rest.is_empty() && self.leaf_wants_backup(leaf_hits))
            .then(|| (rest, value.map(|v| &v[offset..key.len()])));
        if self.host.is_some() {
            // The revived nodes list one more device leaf at most (each one after the
            // first takes its parent's place), besides the new leaf.
            let leaf = usize::from(!rest.is_empty());
            let revived = usize::from(!revives.is_empty());
            let room = self
                .evictable
                .try_reserve(leaf + revived)
                .map_err(|e| Error::out_of_memory("the evictable set", e))
                .and_then(|()| {
                    backups
                        .try_reserve(1)
                        .map_err(|e| Error::out_of_memory("an insert's backups", e))
                })
                .and_then(|()| self.host_prepare_backups(path_end, &backups, leaf_copy));
            if let Err(e) = room {
                self.drop_unused_namespace(ns);
                return Err(e);
            }
        }
        if !rest.is_empty() {
            // Allocate before the leaf exists: on failure the tree caches what it did
            // (as after a match_prefix: splits and access times on the matched prefix).
            if let Err(e) = self.reserve_leaf(ns, priority, now) {
                self.host_drop_prepared();
                self.drop_unused_namespace(ns);
                return Err(e);
            }
            let span = match value {
                Some(v) => Span::from_values(rest, &v[offset..key.len()]),
                None => Span::from_tokens(rest),
            };
            let span = match span {
                Ok(s) => s,
                Err(e) => {
                    self.host_drop_prepared();
                    self.drop_unused_namespace(ns);
                    return Err(e);
                }
            };
            let serial = self.take_serial();
            let mut leaf = Node::new(node);
            leaf.span = span;
            let mut stamps = Stamps::new(serial, now, now);
            stamps.hits = leaf_hits;
            let ck = child_key(ns, rest[0]);
            let slot = self.alloc(leaf, ns, stamps);
            self.set_priority(slot, priority);
            let listed = self.listed(node);
            if listed {
                self.unlist(node);
            }
            // Taken out (the node is unlisted, so its heap position is not lost) so that
            // the existing children's keys can be read while it grows.
            let mut children = std::mem::take(&mut self.nodes[node as usize].children);
            let mut indexes = std::mem::take(&mut self.indexes);
            let filed = children.try_insert(ck, slot, &mut indexes, |c| self.child_key_of(c));
            self.indexes = indexes;
            self.nodes[node as usize].children = children;
            if let Err(e) = filed {
                // The leaf goes again; the parent is as it was (it was not listed: a
                // listed node has no child, and a first child allocates nothing).
                debug_assert!(!listed, "a first child failed to allocate");
                self.host_drop_prepared();
                // Releasing the leaf also drops the namespace if it has no other node.
                self.release(slot);
                return Err(e);
            }
            self.host_on_device_child(node);
            self.evictable_size += rest.len();
            self.relist(slot);
            self.host_name_leaf(slot);
            if self.wants_backup(slot) {
                backups.push(slot); // room reserved before the leaf was made
            }
            node = slot;
        }
        // The call can no longer fail: the host-only nodes of the path take their KV
        // (the new leaf's parent among them: its device child keeps it off the evictable
        // set, as when it comes back before the leaf is added).
        for (n, span) in revives {
            self.revive(n, span);
        }
        if deferred {
            self.path_done(path_end, total, inserted_len, priority, counts_hits);
        }
        self.drop_unused_namespace(ns);
        // Every copy these backups file was prepared: they allocate nothing.
        let mut filed = Ok(());
        for slot in backups {
            filed = filed.and(self.backup_chain(slot));
        }
        self.host_drop_prepared();
        filed?;
        Ok(InsertOutcome {
            prefix_len: device_prefix.unwrap_or(total),
            node: self.handle(node),
        })
    }

    /// Locks the path from `node` up to the root (SEMANTICS.md 1.7). Returns the change of
    /// the evictable size (<= 0).
    /// Nodes from `node` up to the root (excluded) for which `f` holds.
    fn count_path(&self, mut node: u32, f: impl Fn(&Self, u32) -> bool) -> usize {
        let mut n = 0;
        while node != ROOT {
            n += usize::from(f(self, node));
            node = self.nodes[node as usize].parent;
        }
        n
    }

    /// Room for an insert's new leaf: its slot, its side-table entries and its place in
    /// the evictable set (its span and its place in the parent's child index are
    /// allocated by the fallible calls that make them).
    fn reserve_leaf(&mut self, ns: u32, priority: i64, now: u64) -> Result<()> {
        self.reserve_node(&Stamps::new(self.next_serial, now, now), priority, ns)?;
        self.evictable
            .try_reserve(1)
            .map_err(|e| Error::out_of_memory("the evictable set", e))
    }

    /// The hits and priorities of an insert's path, from `node` (whose path holds
    /// `total` tokens) up to the root: each node through which more than `inserted_len`
    /// tokens are inserted takes a hit (when the policy counts them), and every node's
    /// priority is raised to `priority`. The priority table has room
    /// ([`RadixTree::insert`] reserved it), so nothing allocates.
    fn path_done(
        &mut self,
        mut node: u32,
        mut total: usize,
        inserted_len: usize,
        priority: i64,
        counts_hits: bool,
    ) {
        while node != ROOT {
            let counted = counts_hits && total > inserted_len;
            let raised = priority > self.priority(node);
            if counted || raised {
                let listed = self.listed(node);
                if listed {
                    self.unlist(node);
                }
                if raised {
                    self.set_priority(node, priority);
                }
                if counted {
                    self.add_hit(node);
                }
                if listed {
                    self.relist(node);
                }
            }
            let n = &self.nodes[node as usize];
            total -= n.span.len();
            node = n.parent;
        }
    }

    pub fn inc_lock_ref(&mut self, node: NodeRef) -> Result<i64> {
        let start = self.resolve(node)?;
        let mut cur = start;
        while cur != ROOT {
            let n = &self.nodes[cur as usize];
            if n.lock_ref == u32::MAX {
                return Err(Error::LockRef(format!(
                    "inc_lock_ref: a node on the path already holds {} locks, the most a \
                     node can hold",
                    u32::MAX
                )));
            }
            cur = n.parent;
        }
        let mut cur = start;
        let mut delta = 0i64;
        while cur != ROOT {
            let evicted = self.is_evicted(cur);
            let n = &mut self.nodes[cur as usize];
            // A host-only node has no device KV to protect (SGLang locks it all the same).
            if n.lock_ref == 0 && !evicted {
                let len = n.span.len();
                self.evictable_size -= len;
                self.protected_size += len;
                delta -= len as i64;
                if self.listed(cur) {
                    self.unlist(cur);
                }
            }
            let n = &mut self.nodes[cur as usize];
            n.lock_ref += 1;
            cur = n.parent;
        }
        Ok(delta)
    }

    /// Unlocks the path from `node` up to the root. Returns the change of the evictable
    /// size (>= 0). Fails, changing nothing, if `node` holds no lock of its own: its lock
    /// count must exceed the sum of its children's (a node locked only through a
    /// descendant belongs to that descendant's owner), and every lock on the path must be
    /// positive.
    pub fn dec_lock_ref(&mut self, node: NodeRef) -> Result<i64> {
        let start = self.resolve(node)?;
        if start != ROOT {
            let n = &self.nodes[start as usize];
            let child_locks: u64 = n
                .children
                .iter(&self.indexes)
                .map(|c| u64::from(self.nodes[c as usize].lock_ref))
                .sum();
            if n.lock_ref > 0 && u64::from(n.lock_ref) <= child_locks {
                return Err(Error::LockRef(format!(
                    "dec_lock_ref on a node that is locked only through its descendants \
                     (lock_ref {}, its children hold {child_locks}): unlock the node that \
                     was locked",
                    n.lock_ref
                )));
            }
        }
        let mut cur = start;
        let mut freed = 0;
        while cur != ROOT {
            let n = &self.nodes[cur as usize];
            if n.lock_ref == 0 {
                return Err(Error::LockRef(
                    "dec_lock_ref would make a lock count negative: the node is not locked".into(),
                ));
            }
            freed += usize::from(n.lock_ref == 1);
            cur = n.parent;
        }
        // Room in the evictable set for the nodes this unlocks.
        self.evictable
            .try_reserve(freed)
            .map_err(|e| Error::out_of_memory("the evictable set", e))?;
        let mut cur = start;
        let mut delta = 0i64;
        while cur != ROOT {
            let evicted = self.is_evicted(cur);
            let n = &mut self.nodes[cur as usize];
            n.lock_ref -= 1;
            let parent = n.parent;
            if n.lock_ref == 0 {
                if evicted {
                    self.host_offer(cur);
                } else {
                    let len = n.span.len();
                    self.evictable_size += len;
                    self.protected_size -= len;
                    delta += len as i64;
                    self.relist(cur);
                }
            }
            cur = parent;
        }
        Ok(delta)
    }

    /// The KV indices on the path from the root to `node`, concatenated.
    pub fn path_indices(&self, node: NodeRef) -> Result<Vec<i64>> {
        let mut cur = self.resolve(node)?;
        if self.is_evicted(cur) {
            return Err(Error::InvalidArgument(
                "path_indices: the node is only in host memory (load_back it first)".into(),
            ));
        }
        let mut path = Vec::new();
        let mut len = 0;
        while cur != ROOT {
            let n = &self.nodes[cur as usize];
            len += n.span.len();
            path.push(cur);
            cur = n.parent;
        }
        let mut out = Vec::with_capacity(len);
        for &slot in path.iter().rev() {
            self.nodes[slot as usize].span.extend_values(&mut out);
        }
        Ok(out)
    }

    /// Number of tokens on the path from the root to `node`.
    pub fn path_len(&self, node: NodeRef) -> Result<usize> {
        let mut cur = self.resolve(node)?;
        let mut len = 0;
        while cur != ROOT {
            let n = &self.nodes[cur as usize];
            len += n.span.len();
            cur = n.parent;
        }
        Ok(len)
    }

    pub fn node_info(&self, node: NodeRef) -> Result<NodeInfo> {
        let slot = self.resolve(node)?;
        let n = &self.nodes[slot as usize];
        let st = self.stamps(slot);
        Ok(NodeInfo {
            length: n.span.len(),
            lock_ref: u64::from(n.lock_ref),
            hit_count: st.hits,
            priority: self.priority(slot),
            last_access_time: st.last_access,
            creation_time: st.creation,
            num_children: n.children.len(&self.indexes),
            is_root: slot == ROOT,
            namespace: self.namespaces[self.ns(slot) as usize].0.clone(),
        })
    }

    /// The parent of `node` (`None` for the root).
    pub fn parent(&self, node: NodeRef) -> Result<Option<NodeRef>> {
        let slot = self.resolve(node)?;
        Ok((slot != ROOT).then(|| self.handle(self.nodes[slot as usize].parent)))
    }

    /// Children of `slot` in canonical order: namespace, then key tokens.
    pub(crate) fn sorted_children(&self, slot: u32) -> Vec<u32> {
        let mut ids = self.nodes[slot as usize].children.ids(&self.indexes);
        ids.sort_by(|&a, &b| {
            let (na, nb) = (&self.nodes[a as usize], &self.nodes[b as usize]);
            self.namespaces[self.ns(a) as usize]
                .0
                .sort_key()
                .cmp(&self.namespaces[self.ns(b) as usize].0.sort_key())
                .then_with(|| na.span.key().cmp(nb.span.key()))
        });
        ids
    }

    /// Every non-root node, depth first, children in canonical order.
    pub fn dump(&self) -> Vec<NodeDump> {
        let mut out = Vec::with_capacity(self.num_nodes);
        let mut stack: Vec<(u32, usize)> = self
            .sorted_children(ROOT)
            .into_iter()
            .rev()
            .map(|c| (c, 1))
            .collect();
        while let Some((slot, depth)) = stack.pop() {
            let n = &self.nodes[slot as usize];
            let st = self.stamps(slot);
            out.push(NodeDump {
                depth,
                key: n.span.key().to_vec(),
                // A host-only node has no device KV indices.
                value: if self.is_evicted(slot) {
                    Vec::new()
                } else {
                    n.span.values()
                },
                lock_ref: u64::from(n.lock_ref),
                hit_count: st.hits,
                priority: self.priority(slot),
                last_access_time: st.last_access,
                creation_time: st.creation,
                namespace: self.namespaces[self.ns(slot) as usize].0.clone(),
            });
            stack.extend(
                self.sorted_children(slot)
                    .into_iter()
                    .rev()
                    .map(|c| (c, depth + 1)),
            );
        }
        out
    }

    /// The tree as text for people, one node per line indented by its depth (past
    /// [`PRETTY_MAX_INDENT`] levels the depth is written instead, so that a deep chain
    /// prints in space linear in its nodes).
    pub fn pretty(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "RadixCache(page_size={}, policy={}, nodes={}, evictable={}, protected={})",
            self.page_size,
            self.policy.name(),
            self.num_nodes,
            self.evictable_size,
            self.protected_size
        );
        for d in self.dump() {
            let head: Vec<String> = d.key.iter().take(8).map(u32::to_string).collect();
            let more = if d.key.len() > 8 { " ..." } else { "" };
            let ns = match (&d.namespace.extra_key, &d.namespace.cache_salt) {
                (None, None) => String::new(),
                (e, c) => format!(" ns=({e:?}, {c:?})"),
            };
            let _ = writeln!(
                s,
                "{}[{}{}] len={} lock={} hits={} prio={} t={}{}",
                indent(d.depth),
                head.join(" "),
                more,
                d.key.len(),
                d.lock_ref,
                d.hit_count,
                d.priority,
                d.last_access_time,
                ns
            );
        }
        s
    }
}

/// Levels of indentation `pretty` draws before it writes the depth as a number.
pub const PRETTY_MAX_INDENT: usize = 32;

/// `pretty`'s indentation of a node at `depth`.
fn indent(depth: usize) -> String {
    if depth <= PRETTY_MAX_INDENT {
        "  ".repeat(depth)
    } else {
        format!("{}({depth}) ", "  ".repeat(PRETTY_MAX_INDENT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The per-node cost is a documented figure (docs/BENCHMARKS.md): keep it in view.
    #[test]
    fn node_layout_sizes() {
        use super::super::children::Children;
        assert_eq!(std::mem::size_of::<Span>(), 20);
        assert_eq!(std::mem::size_of::<Children>(), 12);
        assert_eq!(std::mem::size_of::<Node>(), 56);
    }

    /// A lock count at its 32-bit limit refuses another lock, changing nothing.
    #[test]
    fn lock_count_limit_is_an_error() {
        let ns = Namespace::default();
        let mut t = RadixTree::new(1, EvictionPolicy::Lru).expect("tree");
        let top = t.insert(&[1, 2], None, &ns, 0, 0).expect("insert").node;
        let leaf = t.insert(&[1, 2, 3], None, &ns, 0, 0).expect("insert").node;
        t.inc_lock_ref(leaf).expect("lock");
        let slot = t.resolve(top).expect("live");
        t.nodes[slot as usize].lock_ref = u32::MAX;
        let before = t.dump();
        assert!(matches!(t.inc_lock_ref(leaf), Err(Error::LockRef(_))));
        assert_eq!(t.dump(), before);
        t.nodes[slot as usize].lock_ref = 1;
        t.dec_lock_ref(leaf).expect("unlock");
        t.check_invariants().expect("invariants");
    }
}
