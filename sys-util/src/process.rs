//! A child process that leads its own process group, so that stopping it stops what it
//! started too (a load generator's clients, a server's workers).

use std::{
    io,
    os::unix::process::CommandExt,
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

/// The group is killed (SIGKILL) when dropped.
pub struct Group(Child);

impl Group {
    /// Spawns `cmd` as the leader of a new process group.
    pub fn spawn(cmd: &mut Command) -> io::Result<Group> {
        Ok(Group(cmd.process_group(0).spawn()?))
    }

    /// The leader's pid, which is the group's id.
    pub fn id(&self) -> u32 {
        self.0.id()
    }

    /// The leader.
    pub fn child(&mut self) -> &mut Child {
        &mut self.0
    }

    /// SIGTERM to the group, then up to `grace` for the leader to exit; its status if it did
    /// (the drop kills what is left).
    pub fn stop(mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        let t = Instant::now();
        while t.elapsed() < grace {
            if let Ok(Some(s)) = self.0.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) on the group our child leads; a group already gone is ESRCH.
        unsafe { libc::kill(-(self.0.id() as i32), signal) };
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.0.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopping_the_group_stops_the_grandchildren() {
        let mut g = Group::spawn(
            Command::new("sh")
                .args(["-c", "sleep 60 & echo $!; wait"])
                .stdout(std::process::Stdio::piped()),
        )
        .unwrap();
        let mut line = String::new();
        io::BufRead::read_line(
            &mut io::BufReader::new(g.child().stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        assert!(g.stop(Duration::from_secs(5)).is_some());
        let t = Instant::now();
        // SAFETY: signal 0 only checks that the process exists.
        while unsafe { libc::kill(grandchild, 0) } == 0 {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "the grandchild lives on"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
