//! What a process or thread is doing, read from /proc: for the messages about work that takes
//! too long.

/// The state, the kernel function it sleeps in and the syscall line of the process or thread
/// whose /proc directory is `dir` (`/proc/PID` or `/proc/PID/task/TID`).
pub fn doing(dir: &str) -> String {
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"))
    };
    let stat = read("stat");
    // After the command name (which may hold spaces and parentheses): the state.
    let state = stat
        .rsplit(')')
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
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
