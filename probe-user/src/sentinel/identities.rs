//! Where each followed process sits in the cluster, looked up once per process before the
//! kernel plane watches it or the sentinel attaches to it, so that every series, alert and
//! status of the process carries the same identity from its first figure on.

use std::{collections::BTreeMap, time::Duration};

use pod_identity::{Identity, Lookup, NameSource, Resolver};

use crate::api::metrics::ProcessLabels;

/// A process's identity and the metric labels made of it.
#[derive(Debug, Clone)]
pub struct Placed {
    pub identity: Identity,
    pub labels: ProcessLabels,
}

/// The identities of the followed processes.
pub struct Identities {
    resolver: Resolver,
    timeout: Duration,
    known: BTreeMap<u32, Placed>,
}

impl Identities {
    /// Names pods from `source`, each request bounded by `timeout`.
    pub fn new(source: NameSource, timeout: Duration) -> Self {
        Self {
            resolver: Resolver::new(source, timeout),
            timeout,
            known: BTreeMap::new(),
        }
    }

    /// `pid`'s identity once known; `None` while the node's pod list is being fetched (never
    /// longer than the fetch's timeout plus a retry).
    pub fn get(&mut self, pid: u32) -> Option<&Placed> {
        if !self.known.contains_key(&pid) {
            let Lookup::Ready(identity) = self.resolver.lookup(pid) else {
                return None;
            };
            let labels = ProcessLabels::new(pid, &identity);
            self.known.insert(pid, Placed { identity, labels });
        }
        self.known.get(&pid)
    }

    /// `pid`'s identity, waiting for the pod list as long as a listed pod needs (the ids
    /// alone after that).
    pub fn wait(&mut self, pid: u32) -> Placed {
        let identity = self.resolver.wait(pid, Resolver::patience(self.timeout));
        let labels = ProcessLabels::new(pid, &identity);
        let placed = Placed { identity, labels };
        self.known.insert(pid, placed.clone());
        placed
    }

    /// Forgets the processes `keep` rejects (they exited or are no longer followed).
    pub fn retain(&mut self, keep: impl Fn(u32) -> bool) {
        self.known.retain(|&pid, _| keep(pid));
    }
}
