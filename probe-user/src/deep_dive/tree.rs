//! The names of a capture's processes and threads: the target's process tree is scanned on a
//! thread of its own when the capture starts, every [`RESCAN`] during it and once more when
//! it stops, so that processes and threads that come and go are named in the trace. A scan
//! reads a few `/proc` files per thread (~7 ms for vLLM's ~200 threads on 2 vCPUs): on the
//! daemon's loop it would hold up the verdicts of the iterations that end meanwhile.

use std::{
    collections::{btree_map::Entry, BTreeMap},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use pod_identity::Identity;

use crate::{deep_dive::capture::ThreadInfo, os::procfs, os::worker::Worker};

/// How often the tree is rescanned for new processes and threads.
const RESCAN: Duration = Duration::from_secs(1);

/// How often the scanning thread looks at its stop flag between scans.
const STOP_CHECK: Duration = Duration::from_millis(20);

/// What the scans saw: process names (pid → name) and threads (tid → info).
#[derive(Debug, Default)]
pub struct Names {
    pub processes: BTreeMap<u32, String>,
    pub threads: BTreeMap<u32, ThreadInfo>,
}

/// Starts scanning the tree of `pid`, whose process is placed by `identity`; the thread's
/// result is every name seen, the last scan made after the stop was asked for.
pub fn start(pid: u32, identity: Identity) -> std::io::Result<Worker<Names>> {
    Worker::spawn("stallscope-tree", move |stop: &AtomicBool| {
        let mut names = Names::default();
        loop {
            scan(pid, &identity, &mut names);
            let next = Instant::now() + RESCAN;
            while Instant::now() < next {
                if stop.load(Ordering::Acquire) {
                    scan(pid, &identity, &mut names);
                    return names;
                }
                std::thread::sleep(STOP_CHECK);
            }
        }
    })
}

fn scan(pid: u32, identity: &Identity, names: &mut Names) {
    for p in procfs::process_tree(pid) {
        if let Entry::Vacant(e) = names.processes.entry(p) {
            if let Some(comm) = procfs::thread_comm(p, p) {
                e.insert(process_name(p, &comm, identity));
            }
        }
        for tid in procfs::threads(p) {
            if let Some(comm) = procfs::thread_comm(p, tid) {
                // A thread's name may change; its id in its namespace does not.
                let ns_tid = match names.threads.get(&tid) {
                    Some(t) if t.pid == p => t.ns_tid,
                    _ => pod_identity::tid_in_namespace(p, tid).filter(|&n| n != tid),
                };
                names.threads.insert(
                    tid,
                    ThreadInfo {
                        pid: p,
                        comm,
                        ns_tid,
                    },
                );
            }
        }
    }
}

/// A captured process's name: `comm`, its pid in its container, and its pod and container
/// (those of the engine `engine` when it is in the engine's container).
fn process_name(pid: u32, comm: &str, engine: &Identity) -> String {
    let own = pod_identity::ids_of(pid);
    let id = if own.container_id.is_some() && own.container_id == engine.container_id {
        Identity {
            pid_in_container: own.pid_in_container,
            ..engine.clone()
        }
    } else {
        own
    };
    let mut name = comm.to_string();
    if let Some(n) = id.pid_in_container {
        name += &format!(" (pid {n} in its container)");
    }
    if let Some(place) = id.short() {
        name += &format!(" [{place}]");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_this_process_and_a_thread_that_starts_after_the_first_scan() {
        let w = start(std::process::id(), Identity::default()).expect("spawn");
        std::thread::sleep(Duration::from_millis(50));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let late = std::thread::Builder::new()
            .name("late-thread".into())
            .spawn(move || {
                let _ = rx.recv();
            })
            .expect("spawn");
        let names = w.stop().expect("the scanning thread");
        let _ = tx.send(());
        late.join().expect("join");
        assert!(names.processes.contains_key(&std::process::id()));
        assert!(
            names.threads.values().any(|t| t.comm == "late-thread"),
            "the last scan, made at the stop, names a thread started after the first: {:?}",
            names.threads.values().map(|t| &t.comm).collect::<Vec<_>>()
        );
    }
}
