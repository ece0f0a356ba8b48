//! What a process or thread is doing, read from /proc: its `stat` fields, and the messages
//! about work that takes too long.

/// The fields of a `/proc/PID/stat` text after the command name, which may itself hold spaces
/// and parentheses: `[0]` is the state, `[1]` the parent's pid, `[6]` the task flags (proc(5),
/// numbered there from 3).
pub fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect()
}

/// The state, the kernel function it sleeps in and the syscall line of the process or thread
/// whose /proc directory is `dir` (`/proc/PID` or `/proc/PID/task/TID`).
pub fn doing(dir: &str) -> String {
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"))
    };
    let stat = read("stat");
    let state = stat_fields(&stat).first().copied().unwrap_or("?");
    format!(
        "state {state}, sleeping in {:?}, syscall {:?}",
        read("wchan"),
        read("syscall")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_start_after_the_command_name() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560";
        assert_eq!(stat_fields(stat)[..3], ["S", "1", "42"]);
        assert!(stat_fields("").is_empty());
    }

    #[test]
    fn a_sleeping_thread_is_seen_asleep() {
        let (tx, rx) = std::sync::mpsc::channel();
        let sleeper = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            std::thread::sleep(std::time::Duration::from_secs(2));
        });
        let tid = rx.recv().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let text = doing(&format!("/proc/self/task/{tid}"));
        // clock_nanosleep is syscall 230 on x86-64.
        assert!(
            text.starts_with("state S") && text.contains("syscall \"230 "),
            "{text}"
        );
        sleeper.join().unwrap();
        assert!(doing("/proc/self/task/0").contains("unreadable"));
    }
}
