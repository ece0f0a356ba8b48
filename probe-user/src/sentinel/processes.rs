//! Which processes the daemon follows: the engines (matched by name or command line, or
//! given with `--pid`) and the processes the kernel plane accounts, matched at each rescan.

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    time::{Duration, Instant},
};

use crate::{config::Config, os::procfs};

/// The processes of one rescan.
pub struct Scan {
    /// Engine processes: the sentinel attaches to them.
    pub engines: BTreeSet<u32>,
    /// Processes the kernel plane watches (the engines among them).
    pub watched: BTreeSet<u32>,
}

/// Matches the node's processes against the configuration. `was_engine` and `was_watched`
/// say whether a process matched at the last rescan: one whose name could not be read this
/// time still does.
pub fn scan(
    cfg: &Config,
    names: &mut ProcessNames,
    was_engine: impl Fn(u32) -> bool,
    was_watched: impl Fn(u32) -> bool,
) -> Scan {
    let me = std::process::id();
    let pids: Vec<u32> = procfs::all_pids()
        .into_iter()
        .filter(|&p| p != me)
        .collect();
    let all = names.read(&pids, Instant::now());
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

/// How long after the daemon first sees a process its name and command line are read at
/// every rescan: engines set their title as they start (vLLM's engine core becomes
/// `VLLM::EngineCore` after its interpreter has started).
const YOUNG: Duration = Duration::from_secs(60);

/// How often the name and command line of an older process are read again (an `exec` or a
/// late retitle is seen within this).
const REREAD: Duration = Duration::from_secs(30);

/// The names and command lines of the node's processes, kept between rescans: reading them
/// all (two `/proc` files per process) every rescan was a fifth of the daemon's CPU.
#[derive(Default)]
pub struct ProcessNames {
    known: HashMap<u32, Known>,
}

struct Known {
    named: Named,
    first_seen: Instant,
    read_at: Instant,
}

impl ProcessNames {
    /// The names of `pids` (the processes that exist now), read again where they are due;
    /// processes not in `pids` are forgotten.
    fn read(&mut self, pids: &[u32], now: Instant) -> Vec<&Named> {
        let live: HashSet<u32> = pids.iter().copied().collect();
        self.known.retain(|pid, _| live.contains(pid));
        for &pid in pids {
            let first_seen = match self.known.get(&pid) {
                Some(k)
                    if !k.named.unread()
                        && now.duration_since(k.first_seen) >= YOUNG
                        && now.duration_since(k.read_at) < REREAD =>
                {
                    continue
                }
                Some(k) => k.first_seen,
                None => now,
            };
            let named = Named {
                pid,
                comm: procfs::thread_comm(pid, pid),
                cmdline: procfs::cmdline(pid),
            };
            let known = Known {
                named,
                first_seen,
                read_at: now,
            };
            self.known.insert(pid, known);
        }
        pids.iter().map(|pid| &self.known[pid].named).collect()
    }
}

/// A process's name and command line (None: the read failed).
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
    use std::time::{Duration, Instant};

    use super::{Named, ProcessNames};

    #[test]
    fn names_are_read_again_while_young_then_every_reread_period() {
        let me = std::process::id();
        let t0 = Instant::now();
        let mut names = ProcessNames::default();
        let s = Duration::from_secs;
        // (seconds after the first sight, when the name was last read afterwards)
        let steps = [(0, 0), (59, 59), (61, 59), (88, 59), (89, 89), (100, 89)];
        for (at, read_at) in steps {
            let named = names.read(&[me], t0 + s(at));
            assert_eq!(named.len(), 1);
            assert!(named[0].comm.is_some(), "this process's name can be read");
            assert_eq!(names.known[&me].read_at, t0 + s(read_at), "at {at} s");
            assert_eq!(names.known[&me].first_seen, t0);
        }
        // A process that is gone is forgotten (a new one with its pid is read afresh).
        assert!(names.read(&[], t0 + s(101)).is_empty());
        assert!(names.known.is_empty());
    }

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
