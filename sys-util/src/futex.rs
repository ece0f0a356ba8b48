//! Sleeping until one of several 32-bit words in shared memory changes: the doorbells that
//! the probes ring when a record worth deciding on lands, so that the reader need not poll.
//!
//! The words are shared futexes (never `FUTEX_PRIVATE_FLAG`): the kernel keys them by the
//! mapped file's inode and offset, so a process that maps the same file wakes the waiter with
//! `FUTEX_WAKE` on its own address of the word.
//!
//! A wake cannot be lost: the caller reads each word *before* it looks at what the word guards
//! and passes that value here; the kernel compares it under the futex bucket's lock, so a ring
//! after the read returns at once, and one during the sleep wakes it (futex(2), "FUTEX_WAIT").
//!
//! # Minimum kernel version
//! `futex_waitv` is 5.16. On older kernels, and for more words than it takes at once, the wait
//! is a plain sleep for the whole timeout: the caller's polling period, as before doorbells.

use std::{sync::atomic::AtomicU32, time::Duration};

/// The most words one `futex_waitv` takes (`FUTEX_WAITV_MAX`).
pub const MAX_WORDS: usize = 128;

const FUTEX2_SIZE_U32: u32 = 0x02;

/// `struct futex_waitv` (include/uapi/linux/futex.h).
#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// A word differed from its expected value, or was rung.
    Rung,
    /// The timeout passed (or the wait was a plain sleep).
    Timeout,
}

/// Sleeps until one of `words` no longer holds its expected value (or is woken), or for
/// `timeout`. A signal ends the wait early, reported as `Rung`: the caller looks and waits
/// again, as after any wake.
pub fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) -> Woken {
    if words.is_empty() || words.len() > MAX_WORDS {
        std::thread::sleep(timeout);
        return Woken::Timeout;
    }
    let waiters: Vec<FutexWaitv> = words
        .iter()
        .map(|(w, expected)| FutexWaitv {
            val: u64::from(*expected),
            uaddr: w.as_ptr() as u64,
            flags: FUTEX2_SIZE_U32,
            reserved: 0,
        })
        .collect();
    let deadline = crate::clock::monotonic_ns() + timeout.as_nanos() as u64;
    let ts = libc::timespec {
        tv_sec: (deadline / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `waiters` is a valid array of `waiters.len()` entries, each naming a word that
    // lives as long as the borrow; `ts` is a valid absolute CLOCK_MONOTONIC deadline.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex_waitv,
            waiters.as_ptr(),
            waiters.len() as libc::c_uint,
            0 as libc::c_uint,
            &ts as *const libc::timespec,
            libc::CLOCK_MONOTONIC,
        )
    };
    if r >= 0 {
        return Woken::Rung;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ETIMEDOUT) => Woken::Timeout,
        Some(libc::EAGAIN) | Some(libc::EINTR) => Woken::Rung,
        // ENOSYS (before 5.16) or a word the kernel refused: poll instead.
        _ => {
            let left = deadline.saturating_sub(crate::clock::monotonic_ns());
            std::thread::sleep(Duration::from_nanos(left));
            Woken::Timeout
        }
    }
}

/// Wakes every waiter on `word` (`FUTEX_WAKE`, shared). Returns how many were woken.
pub fn wake(word: &AtomicU32) -> usize {
    // SAFETY: FUTEX_WAKE only reads the address to key the waiters; `word` is valid.
    let r = unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        )
    };
    r.max(0) as usize
}

/// A word one thread of this process rings to end another's [`wait_any`]: read
/// [`Bell::seen`] before looking at what the bell announces, and wait on
/// `(bell.word(), seen)`; a ring in between then returns the wait at once.
#[derive(Debug, Default)]
pub struct Bell(AtomicU32);

impl Bell {
    /// Announces a change to whoever waits on the bell, or will.
    pub fn ring(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Release);
        wake(&self.0);
    }

    /// The bell's value now, to pass to [`wait_any`] with [`Bell::word`].
    pub fn seen(&self) -> u32 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The word to wait on.
    pub fn word(&self) -> &AtomicU32 {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{
        sync::{atomic::Ordering, Arc},
        time::Instant,
    };

    #[test]
    fn a_changed_word_returns_at_once_and_an_unchanged_one_times_out() {
        let w = AtomicU32::new(7);
        let t = Instant::now();
        assert_eq!(wait_any(&[(&w, 6)], Duration::from_secs(5)), Woken::Rung);
        assert!(t.elapsed() < Duration::from_secs(1));
        let t = Instant::now();
        assert_eq!(
            wait_any(&[(&w, 7)], Duration::from_millis(30)),
            Woken::Timeout
        );
        assert!(t.elapsed() >= Duration::from_millis(30));
    }

    #[test]
    fn a_ring_on_any_word_wakes_the_waiter() {
        let words: Arc<Vec<AtomicU32>> = Arc::new((0..3).map(AtomicU32::new).collect());
        let ringer = {
            let words = words.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                words[2].fetch_add(1, Ordering::Release);
                wake(&words[2]);
            })
        };
        let expected: Vec<(&AtomicU32, u32)> = words.iter().zip(0..).collect();
        let t = Instant::now();
        assert_eq!(wait_any(&expected, Duration::from_secs(10)), Woken::Rung);
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        ringer.join().unwrap();
    }
}
