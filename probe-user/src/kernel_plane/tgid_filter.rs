//! The bitmap of watched processes that every hook tests before any hash lookup
//! ([`probe_common::map::WATCHED_TGIDS`]).
//!
//! Userspace is its only writer, so a word is rewritten whole from the copy kept here
//! without losing a bit set by someone else. The probes read it under a looser rule: while
//! they learn kernel ids ([`probe_common::Config::learn`]) they pass every process, because a
//! process learned in the kernel gets its bit only once userspace sees it in `WATCHED`.

use std::collections::HashMap;

use anyhow::{Context, Result};
use aya::maps::{Array, MapData};
use probe_common::TGID_WORDS;

/// The bitmap and a copy of its non-zero words.
pub struct TgidFilter {
    map: Array<MapData, u64>,
    words: HashMap<u32, u64>,
}

impl TgidFilter {
    pub fn new(map: Array<MapData, u64>) -> Self {
        Self {
            map,
            words: HashMap::new(),
        }
    }

    /// Sets (`on`) or clears the bit of kernel process id `tgid`.
    pub fn set(&mut self, tgid: u32, on: bool) -> Result<()> {
        let (index, bit) = (tgid / 64, 1u64 << (tgid % 64));
        // The kernel never hands out an id past PID_MAX_LIMIT, which the map covers.
        anyhow::ensure!(
            index < TGID_WORDS,
            "process id {tgid} is past PID_MAX_LIMIT"
        );
        let old = self.words.get(&index).copied().unwrap_or(0);
        let new = if on { old | bit } else { old & !bit };
        if new == old {
            return Ok(());
        }
        self.map
            .set(index, new, 0)
            .with_context(|| format!("updating the kernel plane's filter for process {tgid}"))?;
        if new == 0 {
            self.words.remove(&index);
        } else {
            self.words.insert(index, new);
        }
        Ok(())
    }
}
