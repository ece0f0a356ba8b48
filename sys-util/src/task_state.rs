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

/// The state, the kernel function it sleeps in, the syscall line and the innermost frames of
/// the kernel stack (`stack` needs CAP_SYS_ADMIN; without it that part says it is unreadable)
/// of the process or thread whose /proc directory is `dir` (`/proc/PID` or
/// `/proc/PID/task/TID`).
pub fn doing(dir: &str) -> String {
    let read = |f: &str| {
        std::fs::read_to_string(format!("{dir}/{f}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|e| format!("unreadable: {e}"))
    };
    let stat = read("stat");
    let state = stat_fields(&stat).first().copied().unwrap_or("?");
    format!(
        "state {state}, sleeping in {:?}, syscall {:?}, kernel stack {:?}",
        read("wchan"),
        read("syscall"),
        kernel_frames(&read("stack"))
    )
}

/// [`doing`] of each child process of the thread whose /proc directory is `task`
/// (`/proc/PID/task/TID`), as `; its child process PID: …` parts: what the processes a
/// waiting thread started (a remote-call helper) are doing.
pub fn children_doing(task: &str) -> String {
    std::fs::read_to_string(format!("{task}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .map(|c| format!("; its child process {c}: {}", doing(&format!("/proc/{c}"))))
        .collect()
}

/// The innermost [`STACK_FRAMES`] function names of a `/proc/PID/stack` text
/// (`[<0>] name+0x1/0x2` lines), innermost first, joined by ` < `.
fn kernel_frames(stack: &str) -> String {
    stack
        .lines()
        .map(|l| {
            let frame = l.rsplit("] ").next().unwrap_or(l);
            frame.split('+').next().unwrap_or(frame)
        })
        .take(STACK_FRAMES)
        .collect::<Vec<_>>()
        .join(" < ")
}

/// How many kernel frames [`doing`] reports: enough to show the wait and what it serves.
const STACK_FRAMES: usize = 6;

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
        // SAFETY: gettid has no preconditions.
        let task = format!("/proc/self/task/{}", unsafe { libc::gettid() });
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let children = children_doing(&task);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(
            children.contains(&format!("its child process {}: state", child.id())),
            "{children}"
        );
    }

    #[test]
    fn kernel_frames_are_the_innermost_function_names() {
        let stack = "[<0>] hrtimer_nanosleep+0x74/0xf0\n[<0>] common_nsleep+0x30/0x60\n";
        assert_eq!(kernel_frames(stack), "hrtimer_nanosleep < common_nsleep");
        assert_eq!(kernel_frames("unreadable: denied"), "unreadable: denied");
    }
}
