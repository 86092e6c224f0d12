//! A byte-budgeted cache of [`PrefixState`] snapshots keyed by token ids: a radix tree per
//! namespace (the weights that made the snapshots), so a prompt finds the longest cached prefix
//! of its ids in one walk.
//!
//! - Keys are token ids, not text: a snapshot is valid for exactly the ids it ran, whatever
//!   rendered them. Namespaces keep snapshots of different weights (the text and the multimodal
//!   deciders differ in every language module) apart.
//! - A snapshot is stored whole (every layer's part in one [`Arc`]) and evicted whole, so a hit
//!   always has all its parts. A hit hands out the `Arc`: a snapshot evicted after a batch
//!   planned with it stays alive until that batch is done.
//! - Budget: [`PrefixState::size_bytes`] of the entries never exceeds it; a snapshot larger than
//!   the whole budget is not stored.
//! - Eviction is GreedyDual-Size (Cao and Irani, 1997) with the tokens a snapshot saves as its
//!   cost: each entry's priority is the cache's floor at its last use plus the tokens it saves
//!   per MiB it holds; the lowest priority goes first and the floor rises to it. Entries of
//!   equal worth leave in least-recently-used order; a long prefix (many tokens saved per byte)
//!   outlives a short one used about as recently.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::{ensure, Result};

use crate::prefix::PrefixState;

/// No parent: the root of a namespace.
const NONE: usize = usize::MAX;

/// A cached snapshot found for a prompt.
#[derive(Clone, Debug)]
pub struct Hit {
    /// Tokens of the prompt the snapshot covers (its key's length).
    pub tokens: usize,
    pub state: Arc<PrefixState>,
}

/// What [`PrefixCache::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inserted {
    /// Stored, after evicting this many entries to make room.
    Stored { evicted: usize },
    /// An entry for the same ids was already there (another batch computed it first); it is
    /// kept and counts as used now.
    AlreadyCached,
    /// Larger than the whole budget: not stored.
    TooLarge,
}

struct Entry {
    state: Arc<PrefixState>,
    bytes: usize,
    priority: f64,
    /// Breaks priority ties: the least recently used goes first.
    last_use: u64,
}

#[derive(Default)]
struct Node {
    /// Ids on the edge from the parent to this node (empty for a root).
    edge: Vec<u32>,
    parent: usize,
    /// By the first id of the child's edge.
    children: HashMap<u32, usize>,
    entry: Option<Entry>,
    /// Whether the slot is on the free list.
    free: bool,
}

/// See the module docs.
pub struct PrefixCache {
    budget: usize,
    bytes: usize,
    entries: usize,
    nodes: Vec<Node>,
    free: Vec<usize>,
    roots: HashMap<String, usize>,
    /// GreedyDual's inflation: the priority of the last entry evicted.
    floor: f64,
    clock: u64,
}

impl PrefixCache {
    /// A cache that holds at most `budget` bytes of snapshots.
    pub fn new(budget: usize) -> Self {
        Self {
            budget,
            bytes: 0,
            entries: 0,
            nodes: Vec::new(),
            free: Vec::new(),
            roots: HashMap::new(),
            floor: 0.0,
            clock: 0,
        }
    }

    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of the snapshots held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Snapshots held.
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// The longest cached prefix of `ids` in `namespace` that covers at most `max_tokens` of them
    /// (callers resuming a segment pass `ids.len() - 1`: a segment needs a token of its own).
    /// The entry found counts as used now.
    pub fn longest_prefix(
        &mut self,
        namespace: &str,
        ids: &[u32],
        max_tokens: usize,
    ) -> Option<Hit> {
        let &root = self.roots.get(namespace)?;
        let limit = max_tokens.min(ids.len());
        let (mut node, mut depth) = (root, 0);
        let mut best = None;
        loop {
            if depth > 0 && self.nodes[node].entry.is_some() {
                best = Some((node, depth));
            }
            let Some(&child) = ids
                .get(depth)
                .and_then(|id| self.nodes[node].children.get(id))
            else {
                break;
            };
            let edge = &self.nodes[child].edge;
            if depth + edge.len() > limit || ids[depth..depth + edge.len()] != edge[..] {
                break;
            }
            depth += edge.len();
            node = child;
        }
        let (node, tokens) = best?;
        self.touch(node);
        let state = self.nodes[node]
            .entry
            .as_ref()
            .expect("found")
            .state
            .clone();
        Some(Hit { tokens, state })
    }

    /// Stores the snapshot of exactly `ids` (its token count must be theirs), evicting what the
    /// budget needs; never the entry just stored.
    pub fn insert(
        &mut self,
        namespace: &str,
        ids: &[u32],
        state: Arc<PrefixState>,
    ) -> Result<Inserted> {
        ensure!(
            !ids.is_empty() && state.tokens() == ids.len(),
            "a snapshot of {} tokens keyed by {} ids",
            state.tokens(),
            ids.len()
        );
        let bytes = state.size_bytes();
        if bytes > self.budget {
            return Ok(Inserted::TooLarge);
        }
        let node = self.node_for(namespace, ids);
        if self.nodes[node].entry.is_some() {
            self.touch(node);
            return Ok(Inserted::AlreadyCached);
        }
        self.clock += 1;
        self.nodes[node].entry = Some(Entry {
            priority: self.floor + worth(ids.len(), bytes),
            state,
            bytes,
            last_use: self.clock,
        });
        self.bytes += bytes;
        self.entries += 1;
        let mut evicted = 0;
        while self.bytes > self.budget {
            self.evict_one(node);
            evicted += 1;
        }
        Ok(Inserted::Stored { evicted })
    }

    /// Drops every entry (the budget and the floor stay).
    pub fn clear(&mut self) {
        self.nodes.clear();
        self.free.clear();
        self.roots.clear();
        self.bytes = 0;
        self.entries = 0;
    }

    /// Marks `node`'s entry used now.
    fn touch(&mut self, node: usize) {
        self.clock += 1;
        let (floor, clock) = (self.floor, self.clock);
        let depth = self.depth(node);
        let entry = self.nodes[node].entry.as_mut().expect("an entry");
        entry.priority = floor + worth(depth, entry.bytes);
        entry.last_use = clock;
    }

    /// Tokens from the root to the end of `node`.
    fn depth(&self, mut node: usize) -> usize {
        let mut depth = 0;
        while node != NONE {
            depth += self.nodes[node].edge.len();
            node = self.nodes[node].parent;
        }
        depth
    }

    /// The node whose path is exactly `ids`, made (splitting an edge if needed) when missing.
    fn node_for(&mut self, namespace: &str, ids: &[u32]) -> usize {
        let root = match self.roots.get(namespace) {
            Some(&root) => root,
            None => {
                let root = self.alloc(Vec::new(), NONE);
                self.roots.insert(namespace.to_string(), root);
                root
            }
        };
        let (mut node, mut depth) = (root, 0);
        while depth < ids.len() {
            let Some(&child) = self.nodes[node].children.get(&ids[depth]) else {
                let leaf = self.alloc(ids[depth..].to_vec(), node);
                self.nodes[node].children.insert(ids[depth], leaf);
                return leaf;
            };
            let edge = &self.nodes[child].edge;
            let edge_len = edge.len();
            let common = edge
                .iter()
                .zip(&ids[depth..])
                .take_while(|(a, b)| a == b)
                .count();
            if common < edge_len {
                // Split the edge: a new node for the shared part, the old child below it.
                let rest = self.nodes[child].edge.split_off(common);
                let head = std::mem::replace(&mut self.nodes[child].edge, rest);
                let mid = self.alloc(head, node);
                let first = self.nodes[child].edge[0];
                self.nodes[mid].children.insert(first, child);
                self.nodes[child].parent = mid;
                self.nodes[node].children.insert(ids[depth], mid);
                node = mid;
            } else {
                node = child;
            }
            depth += common;
        }
        node
    }

    fn alloc(&mut self, edge: Vec<u32>, parent: usize) -> usize {
        let node = Node {
            edge,
            parent,
            ..Node::default()
        };
        match self.free.pop() {
            Some(i) => {
                self.nodes[i] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    /// Evicts the entry of lowest priority other than `keep`'s.
    fn evict_one(&mut self, keep: usize) {
        let victim = self
            .nodes
            .iter()
            .enumerate()
            .filter(|&(i, n)| i != keep && !n.free)
            .filter_map(|(i, n)| n.entry.as_ref().map(|e| (i, e.priority, e.last_use)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.2.cmp(&b.2)))
            .map(|(i, ..)| i)
            .expect("over budget with only the new entry, which fits the budget alone");
        let entry = self.nodes[victim].entry.take().expect("an entry");
        self.floor = self.floor.max(entry.priority);
        self.bytes -= entry.bytes;
        self.entries -= 1;
        self.prune(victim);
    }

    /// Removes nodes left with neither an entry nor children, and merges a node left with one
    /// child and no entry into that child, so the tree stays compressed.
    fn prune(&mut self, mut node: usize) {
        loop {
            let n = &self.nodes[node];
            if n.parent == NONE || n.entry.is_some() {
                break;
            }
            match n.children.len() {
                0 => {
                    let (parent, first) = (n.parent, n.edge[0]);
                    self.nodes[parent].children.remove(&first);
                    self.release(node);
                    node = parent;
                }
                1 => {
                    let child = *n.children.values().next().expect("one child");
                    let mut edge = std::mem::take(&mut self.nodes[node].edge);
                    edge.extend_from_slice(&self.nodes[child].edge);
                    let parent = self.nodes[node].parent;
                    self.nodes[child].edge = edge;
                    self.nodes[child].parent = parent;
                    let first = self.nodes[child].edge[0];
                    self.nodes[parent].children.insert(first, child);
                    self.release(node);
                    node = child;
                    break;
                }
                _ => break,
            }
        }
        // A namespace left empty loses its root.
        if self.nodes[node].parent == NONE && self.nodes[node].children.is_empty() {
            self.roots.retain(|_, &mut root| root != node);
            self.release(node);
        }
    }

    fn release(&mut self, node: usize) {
        self.nodes[node] = Node {
            free: true,
            parent: NONE,
            ..Node::default()
        };
        self.free.push(node);
    }

    /// Recounts the entries and their bytes from the tree (tests check the counters with it).
    pub fn recount(&self) -> (usize, usize) {
        let live = self.nodes.iter().filter(|n| !n.free);
        live.filter_map(|n| n.entry.as_ref())
            .fold((0, 0), |(n, b), e| (n + 1, b + e.bytes))
    }
}

/// Tokens a snapshot saves per MiB it holds.
fn worth(tokens: usize, bytes: usize) -> f64 {
    tokens as f64 * f64::from(1u32 << 20) / bytes.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prefix::{LayerState, Values};

    /// A snapshot of `tokens` tokens holding `4 * (fixed + 2 * tokens)` bytes.
    fn snap(tokens: usize, fixed: usize) -> Arc<PrefixState> {
        let layers = vec![
            LayerState::DeltaNet {
                state: Values::host(vec![0.5; fixed]),
                conv_window: Values::host(Vec::new()),
            },
            LayerState::Attention {
                k: Values::host(vec![1.0; tokens]),
                v: Values::host(vec![2.0; tokens]),
            },
        ];
        Arc::new(PrefixState::new(tokens, tokens as u32, layers))
    }

    fn ids(len: usize, tag: u32) -> Vec<u32> {
        (0..len as u32).map(|i| i * 7 + tag).collect()
    }

    fn check(cache: &PrefixCache) {
        assert_eq!(cache.recount(), (cache.len(), cache.bytes()));
        assert!(cache.bytes() <= cache.budget());
    }

    #[test]
    fn the_longest_prefix_leaving_a_token_is_found() {
        let mut cache = PrefixCache::new(1 << 20);
        let long = ids(100, 1);
        for len in [10, 40, 64, 65] {
            let s = cache.insert("text", &long[..len], snap(len, 8)).unwrap();
            assert_eq!(s, Inserted::Stored { evicted: 0 });
        }
        // A branch off the 40-token node.
        let mut other = long[..50].to_vec();
        other[45] = 9999;
        cache.insert("text", &other, snap(50, 8)).unwrap();
        check(&cache);
        let found = |c: &mut PrefixCache, q: &[u32], max: usize| {
            c.longest_prefix("text", q, max).map(|h| h.tokens)
        };
        assert_eq!(found(&mut cache, &long, 99), Some(65));
        assert_eq!(found(&mut cache, &long[..65], 64), Some(64));
        assert_eq!(found(&mut cache, &long[..64], 63), Some(40));
        assert_eq!(found(&mut cache, &long[..11], 10), Some(10));
        assert_eq!(found(&mut cache, &long[..10], 9), None);
        assert_eq!(found(&mut cache, &other, 49), Some(40));
        assert_eq!(
            found(&mut cache, &[other.clone(), vec![1]].concat(), 50),
            Some(50)
        );
        // Another first token: nothing.
        assert_eq!(found(&mut cache, &ids(100, 2), 99), None);
        let hit = cache.longest_prefix("text", &long, 99).unwrap();
        assert_eq!(hit.state.tokens(), 65);
    }

    #[test]
    fn namespaces_are_kept_apart() {
        let mut cache = PrefixCache::new(1 << 20);
        let key = ids(20, 3);
        cache.insert("text", &key, snap(20, 8)).unwrap();
        assert!(cache
            .longest_prefix("multimodal", &ids(30, 3), 29)
            .is_none());
        assert!(cache.longest_prefix("text", &ids(30, 3), 29).is_some());
        // The same ids in another namespace are another entry.
        let s = cache.insert("multimodal", &key, snap(20, 8)).unwrap();
        assert_eq!(s, Inserted::Stored { evicted: 0 });
        assert_eq!(cache.len(), 2);
        check(&cache);
    }

    #[test]
    fn the_budget_is_never_exceeded_and_equal_entries_leave_least_recently_used_first() {
        // Each entry: 4 * (100 + 2 * 10) = 480 bytes; three fit.
        let mut cache = PrefixCache::new(3 * 480 + 100);
        for tag in 0..3 {
            cache.insert("t", &ids(10, tag), snap(10, 100)).unwrap();
        }
        assert!(cache.longest_prefix("t", &ids(11, 0), 10).is_some()); // 0 is now the newest
        let s = cache.insert("t", &ids(10, 3), snap(10, 100)).unwrap();
        assert_eq!(s, Inserted::Stored { evicted: 1 });
        check(&cache);
        let has = |c: &mut PrefixCache, tag| c.longest_prefix("t", &ids(11, tag), 10).is_some();
        assert!(!has(&mut cache, 1), "the least recently used left");
        assert!(has(&mut cache, 2)); // order now: 0, 3, 2
        cache.insert("t", &ids(10, 4), snap(10, 100)).unwrap();
        assert!(!has(&mut cache, 0));
        assert!(has(&mut cache, 3) && has(&mut cache, 2) && has(&mut cache, 4));
        for tag in 5..40 {
            cache.insert("t", &ids(10, tag), snap(10, 100)).unwrap();
            check(&cache);
            assert_eq!(cache.len(), 3);
        }
    }

    #[test]
    fn a_snapshot_that_saves_more_tokens_per_byte_outlives_a_fresher_cheap_one() {
        // 4 * (100 + 2 * 200) = 2000 bytes for 200 tokens, against 480 bytes for 10.
        let mut cache = PrefixCache::new(2000 + 480 + 100);
        cache.insert("t", &ids(200, 1), snap(200, 100)).unwrap();
        cache.insert("t", &ids(10, 2), snap(10, 100)).unwrap();
        cache.insert("t", &ids(10, 3), snap(10, 100)).unwrap();
        check(&cache);
        assert!(cache.longest_prefix("t", &ids(201, 1), 200).is_some());
        assert!(cache.longest_prefix("t", &ids(11, 2), 10).is_none());
        assert!(cache.longest_prefix("t", &ids(11, 3), 10).is_some());
    }

    #[test]
    fn a_snapshot_larger_than_the_budget_is_never_stored() {
        let mut cache = PrefixCache::new(400);
        let s = cache.insert("t", &ids(10, 0), snap(10, 100)).unwrap();
        assert_eq!(s, Inserted::TooLarge);
        assert!(cache.is_empty());
        assert_eq!(cache.bytes(), 0);
        // A budget of 0 stores nothing.
        let mut none = PrefixCache::new(0);
        assert_eq!(
            none.insert("t", &ids(1, 0), snap(1, 0)).unwrap(),
            Inserted::TooLarge
        );
    }

    #[test]
    fn a_second_insert_of_the_same_ids_keeps_the_first_and_counts_once() {
        let mut cache = PrefixCache::new(1 << 20);
        let first = snap(10, 8);
        cache.insert("t", &ids(10, 0), first.clone()).unwrap();
        let s = cache.insert("t", &ids(10, 0), snap(10, 8)).unwrap();
        assert_eq!(s, Inserted::AlreadyCached);
        assert_eq!(cache.len(), 1);
        check(&cache);
        let hit = cache.longest_prefix("t", &ids(11, 0), 10).unwrap();
        assert!(Arc::ptr_eq(&hit.state, &first));
        // A key whose length is not the snapshot's is refused.
        assert!(cache.insert("t", &ids(9, 0), snap(10, 8)).is_err());
        assert!(cache.insert("t", &[], snap(0, 8)).is_err());
    }

    #[test]
    fn eviction_prunes_and_merges_the_tree_and_keeps_it_consistent() {
        // Room for two of the 40-token entries (4 * (0 + 80) = 320 bytes each).
        let mut cache = PrefixCache::new(700);
        let base = ids(40, 5);
        let mut a = base.clone();
        a[30] = 7777;
        let mut b = base.clone();
        b[20] = 8888;
        cache.insert("t", &base, snap(40, 0)).unwrap();
        cache.insert("t", &a, snap(40, 0)).unwrap();
        cache.insert("t", &b, snap(40, 0)).unwrap(); // evicts base
        check(&cache);
        assert_eq!(cache.len(), 2);
        assert!(cache
            .longest_prefix("t", &[base.clone(), vec![0]].concat(), 40)
            .is_none());
        let got = cache.longest_prefix("t", &[a.clone(), vec![0]].concat(), 40);
        assert_eq!(got.map(|h| h.tokens), Some(40));
        // Evicting everything leaves no node behind.
        cache.insert("t", &ids(80, 9), snap(80, 0)).unwrap(); // 640 bytes: both go
        check(&cache);
        assert_eq!(cache.len(), 1);
        let live = cache.nodes.iter().filter(|n| !n.free).count();
        assert_eq!(live, 2, "a root and one leaf");
        cache.clear();
        assert!(cache.longest_prefix("t", &ids(81, 9), 80).is_none());
    }
}
