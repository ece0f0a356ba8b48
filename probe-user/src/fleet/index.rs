//! What the store holds of a serving group's deep dive, and where.
//!
//! Layout under the store's prefix, for the group `G` whose deep dive starts at the instant
//! `T` (ns since the epoch; every node of the group shares it):
//! - `groups/G/T/NODE/trace.pftrace`, `.../report.json`: each node's files;
//! - `groups/G/T/NODE/entry.json`: that node's [`NodeEntry`], written last by the node;
//! - `groups/G/T/index.json`: the [`GroupIndex`], rebuilt from the entries by every node
//!   after its upload and by `stallscope fleet merge`.
//!
//! The entries are the truth and the index a view of them: each node writes only its own
//! entry, so no node's upload can undo another's; a node that rebuilds the index at the same
//! moment as another may leave it one entry short until the next rebuild.
//!
//! A deep dive outside any group goes to `nodes/NODE/ID-MS/` (no index).

use serde::{Deserialize, Serialize};

use crate::deep_dive::registry::SuspectBrief;

/// Where a group's deep dive lives, relative to the store's prefix.
pub fn group_dir(group: &str, instant_unix_ns: u64) -> String {
    format!("groups/{group}/{instant_unix_ns}")
}

/// One node's part of a group's deep dive.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The node's name (`[fleet] node`).
    pub node: String,
    /// The serving group.
    pub group: String,
    /// The group's instant, ns since the epoch.
    pub instant_unix_ns: u64,
    /// The engine captured: its pid on the node and its pod, when known.
    pub pid: u32,
    pub pod: Option<String>,
    /// The node's deep-dive window, ns since the epoch by its trace's clock snapshot.
    pub window_unix_ns: [u64; 2],
    /// The node's clock snapshot: CLOCK_REALTIME − CLOCK_MONOTONIC, ns.
    pub clock_offset_ns: i64,
    /// Its capture began this long after the group's instant, ms (by its trace's clock).
    pub late_ms: f64,
    /// The files, relative to the store's prefix.
    pub trace: String,
    pub report: String,
    /// The ranking's verdict and its first suspects.
    pub category: Option<String>,
    pub summary: Option<String>,
    pub suspects: Vec<SuspectBrief>,
    /// When this node's engine began to run slower than its baseline: the start of its
    /// earliest sentinel alert open during the look-back before the instant or in the window,
    /// ms since the epoch; None: it did not.
    pub slowed_unix_ms: Option<u64>,
}

/// A group's deep dive: every node's entry, and the node whose engine slowed first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupIndex {
    pub group: String,
    pub instant_unix_ns: u64,
    /// The nodes' entries, by node name.
    pub nodes: Vec<NodeEntry>,
    /// The node whose engine's slowdown began first; None when no engine slowed.
    pub first_to_slow: Option<String>,
    /// The spread of the nodes' capture starts, ms (largest − smallest window start).
    pub start_spread_ms: f64,
}

impl GroupIndex {
    /// The index of `entries` (one group's instant).
    pub fn of(group: &str, instant_unix_ns: u64, mut entries: Vec<NodeEntry>) -> GroupIndex {
        entries.sort_by(|a, b| a.node.cmp(&b.node));
        let first_to_slow = entries
            .iter()
            .filter_map(|e| Some((e.slowed_unix_ms?, &e.node)))
            .min()
            .map(|(_, n)| n.clone());
        let starts = entries.iter().map(|e| e.window_unix_ns[0]);
        let spread = match (starts.clone().min(), starts.max()) {
            (Some(a), Some(b)) => (b - a) as f64 / 1e6,
            _ => 0.0,
        };
        GroupIndex {
            group: group.to_string(),
            instant_unix_ns,
            nodes: entries,
            first_to_slow,
            start_spread_ms: spread,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(node: &str, start: u64, slowed: Option<u64>) -> NodeEntry {
        NodeEntry {
            node: node.into(),
            group: "g".into(),
            instant_unix_ns: 1_000,
            pid: 7,
            pod: None,
            window_unix_ns: [start, start + 3_000_000_000],
            clock_offset_ns: 0,
            late_ms: 0.0,
            trace: String::new(),
            report: String::new(),
            category: None,
            summary: None,
            suspects: Vec::new(),
            slowed_unix_ms: slowed,
        }
    }

    /// The first to slow is the earliest slowdown, whatever the order of the entries; none
    /// when no engine slowed.
    #[test]
    fn first_to_slow_is_the_earliest_slowdown() {
        for (entries, want) in [
            (
                vec![
                    entry("b", 2_000_000, Some(50)),
                    entry("a", 1_000_000, None),
                    entry("c", 4_000_000, Some(40)),
                ],
                Some("c"),
            ),
            (vec![entry("a", 1, None), entry("b", 2, None)], None),
            (vec![], None),
        ] {
            let i = GroupIndex::of("g", 1_000, entries);
            assert_eq!(i.first_to_slow.as_deref(), want);
            assert!(i.nodes.windows(2).all(|w| w[0].node < w[1].node));
        }
        let i = GroupIndex::of(
            "g",
            1,
            vec![entry("a", 1_000_000, None), entry("b", 4_500_000, None)],
        );
        assert_eq!(i.start_spread_ms, 3.5);
    }
}
