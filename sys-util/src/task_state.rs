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
    let fields = stat_fields(&stat);
    let state = fields.first().copied().unwrap_or("?");
    format!(
        "state {state}{}, sleeping in {:?}, syscall {:?}, kernel stack {:?}",
        scheduling(&fields),
        read("wchan"),
        read("syscall"),
        kernel_frames(&read("stack"))
    )
}

/// `, on CPU n, POLICY[ priority], CPU time t s` from [`stat_fields`]: where a runnable thread
/// waits for a CPU, and whether it got any (proc(5): `processor`, `rt_priority` and `policy`
/// are fields 39-41, `utime` and `stime` 14-15 in clock ticks).
fn scheduling(fields: &[&str]) -> String {
    let field = |n| stat_number(fields, n);
    let (Some(cpu), Some(prio), Some(policy)) = (field(39), field(40), field(41)) else {
        return String::new();
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks = field(14).unwrap_or(0) + field(15).unwrap_or(0);
    format!(
        ", on CPU {cpu}, {}, CPU time {:.2} s",
        policy_name(policy, prio),
        ticks as f64 / hz
    )
}

/// Field `n` of a `/proc/PID/stat` text (numbered as in proc(5)) from its [`stat_fields`], as a
/// number.
fn stat_number(fields: &[&str], n: usize) -> Option<u64> {
    fields.get(n - 3).and_then(|f| f.parse().ok())
}

fn policy_name(policy: u64, prio: u64) -> String {
    match policy as i32 {
        libc::SCHED_OTHER => "SCHED_OTHER".into(),
        libc::SCHED_BATCH => "SCHED_BATCH".into(),
        libc::SCHED_IDLE => "SCHED_IDLE".into(),
        libc::SCHED_FIFO => format!("SCHED_FIFO {prio}"),
        libc::SCHED_RR => format!("SCHED_RR {prio}"),
        p if p == crate::sched::SCHED_DEADLINE as i32 => "SCHED_DEADLINE".into(),
        other => format!("policy {other}"),
    }
}

/// The kernel's "is a kernel thread" task flag (`PF_KTHREAD`, include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// What competes for the host's CPUs ahead of ordinary threads: the CPU pressure line of
/// `/proc/pressure/cpu` and every user-space thread at a real-time or deadline policy, as a
/// `; …` part. A thread that is runnable for seconds on a host with such a spinner pinned to its
/// CPU gets only what real-time throttling leaves (`sched_rt_runtime_us`, 5 % by default).
pub fn cpu_contention() -> String {
    let pressure = std::fs::read_to_string("/proc/pressure/cpu")
        .ok()
        .and_then(|p| p.lines().next().map(str::to_string))
        .unwrap_or_else(|| "unreadable".into());
    let mut rt = Vec::new();
    for task in std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .flat_map(|p| {
            std::fs::read_dir(p.path().join("task"))
                .into_iter()
                .flatten()
        })
        .flatten()
    {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let fields = stat_fields(&stat);
        let field = |n| stat_number(&fields, n);
        let kernel = field(9).is_some_and(|f| f & PF_KTHREAD != 0);
        let policy = field(41).unwrap_or(0) as i32;
        if kernel || crate::sched::is_fair(policy) {
            continue;
        }
        let comm = stat
            .split_once('(')
            .and_then(|(_, r)| r.rsplit_once(')'))
            .map_or("?", |(c, _)| c);
        let path = task.path();
        let pid = path
            .parent()
            .and_then(|t| t.parent())
            .and_then(|p| p.file_name())
            .map_or("?".into(), |p| p.to_string_lossy());
        rt.push(format!(
            "thread {} of {pid} {comm} (state {}{})",
            task.file_name().to_string_lossy(),
            fields.first().copied().unwrap_or("?"),
            scheduling(&fields)
        ));
    }
    let rt = if rt.is_empty() {
        "none".to_string()
    } else {
        rt.join(", ")
    };
    format!("; the host's CPU pressure: {pressure}; its real-time threads: {rt}")
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
    fn a_real_time_thread_is_in_the_census() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let param = libc::sched_param { sched_priority: 1 };
            // SAFETY: the calling thread (0), a valid policy and parameter.
            let fifo = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } == 0;
            // SAFETY: gettid has no preconditions.
            tx.send((fifo, unsafe { libc::gettid() })).unwrap();
            done_rx.recv().unwrap();
        });
        let (fifo, tid) = rx.recv().unwrap();
        let census = cpu_contention();
        done_tx.send(()).unwrap();
        t.join().unwrap();
        assert!(
            census.starts_with("; the host's CPU pressure: "),
            "{census}"
        );
        // Without CAP_SYS_NICE the thread stays ordinary and is left out.
        let entry = format!("thread {tid} of {} ", std::process::id());
        assert_eq!(census.contains(&entry), fifo, "{census}");
        if fifo {
            assert!(census.contains("SCHED_FIFO 1, CPU time"), "{census}");
        }
        // SAFETY: gettid has no preconditions.
        let me = doing(&format!("/proc/self/task/{}", unsafe { libc::gettid() }));
        assert!(me.contains(", SCHED_OTHER, CPU time "), "{me}");
    }

    #[test]
    fn kernel_frames_are_the_innermost_function_names() {
        let stack = "[<0>] hrtimer_nanosleep+0x74/0xf0\n[<0>] common_nsleep+0x30/0x60\n";
        assert_eq!(kernel_frames(stack), "hrtimer_nanosleep < common_nsleep");
        assert_eq!(kernel_frames("unreadable: denied"), "unreadable: denied");
    }
}
