//! Which processes the daemon follows: the engines (matched by name or command line, or
//! given with `--pid`) and the processes the kernel plane accounts, read once per rescan.

use std::collections::BTreeSet;

use crate::{config::Config, os::procfs};

/// The processes of one rescan.
pub struct Scan {
    /// Engine processes: the sentinel attaches to them.
    pub engines: BTreeSet<u32>,
    /// Processes the kernel plane watches (the engines among them).
    pub watched: BTreeSet<u32>,
}

/// Reads every process's name and command line once and matches them against the
/// configuration. `was_engine` and `was_watched` say whether a process matched at the last
/// rescan: one whose name could not be read this time still does.
pub fn scan(
    cfg: &Config,
    was_engine: impl Fn(u32) -> bool,
    was_watched: impl Fn(u32) -> bool,
) -> Scan {
    let me = std::process::id();
    let all: Vec<Named> = procfs::all_pids()
        .into_iter()
        .filter(|&p| p != me)
        .map(|pid| Named {
            pid,
            comm: procfs::thread_comm(pid, pid),
            cmdline: procfs::cmdline(pid),
        })
        .collect();
    let explicit = &cfg.watch.pids;
    let engines: BTreeSet<u32> = if explicit.is_empty() {
        all.iter()
            .filter(|p| p.still_matches(&cfg.sentinel.engine_patterns, was_engine(p.pid)))
            .map(|p| p.pid)
            .collect()
    } else {
        explicit
            .iter()
            .copied()
            .filter(|&p| procfs::process_exists(p))
            .collect()
    };
    let mut watched: BTreeSet<u32> = all
        .iter()
        .filter(|p| p.still_matches(&cfg.watch.process_patterns, was_watched(p.pid)))
        .map(|p| p.pid)
        .collect();
    watched.extend(&engines);
    Scan { engines, watched }
}

/// A process's name and command line, read once per rescan (None: the read failed).
struct Named {
    pid: u32,
    comm: Option<String>,
    cmdline: Option<String>,
}

impl Named {
    fn matches(&self, patterns: &[String]) -> bool {
        let has = |s: &Option<String>, p: &str| s.as_deref().is_some_and(|s| s.contains(p));
        patterns
            .iter()
            .any(|p| has(&self.comm, p) || has(&self.cmdline, p))
    }

    /// Whether the name or the command line could not be read.
    fn unread(&self) -> bool {
        self.comm.is_none() || self.cmdline.is_none()
    }

    /// Whether it matches `patterns`; a process that matched before (`was`) and whose name
    /// could not be read this time (a failed /proc read, not a name that changed) still does.
    fn still_matches(&self, patterns: &[String], was: bool) -> bool {
        self.matches(patterns) || (was && self.unread())
    }
}

#[cfg(test)]
mod tests {
    use super::Named;

    #[test]
    fn a_process_is_matched_on_what_could_be_read() {
        let patterns = ["VLLM::EngineCore".to_string()];
        let engine = |cmdline: Option<&str>| Named {
            pid: 7,
            // comm is cut to 15 bytes: only the command line carries the whole name.
            comm: Some("VLLM::EngineCor".into()),
            cmdline: cmdline.map(str::to_string),
        };
        assert!(engine(Some("VLLM::EngineCore")).matches(&patterns));
        assert!(!engine(Some("VLLM::EngineCore")).unread());
        // A failed cmdline read neither matches nor counts as a process that stopped matching:
        // one that matched before still does.
        assert!(!engine(None).matches(&patterns));
        assert!(engine(None).unread());
        assert!(engine(None).still_matches(&patterns, true));
        assert!(!engine(None).still_matches(&patterns, false));
        // A name that was read and no longer matches does not.
        assert!(!engine(Some("python other.py")).matches(&patterns));
        assert!(!engine(Some("python other.py")).unread());
        assert!(!engine(Some("python other.py")).still_matches(&patterns, true));
    }
}
