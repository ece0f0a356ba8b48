//! The producer's side of the ring file: the layout `pyframe-tracer/src/ring.rs` reads and
//! `probe.py` documents, mapped a second time by this module.
//!
//! One lane per thread (single producer), the last one shared through a non-blocking flag; a
//! record's bytes are stored before its lane's write sequence, with release ordering, so a
//! reader that sees the sequence sees the record.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// "STLSCPR1" read as a little-endian u64.
const MAGIC: u64 = 0x3152_5043_534C_5453;
const RECORD_SIZE: usize = 128;
const LANE_BASE: usize = 256;
const LANE_SIZE: usize = 64;
/// The lanes' counters end where the response area begins.
const CONTROL: usize = 4096;
const OFF_RECORD_SIZE: usize = 12;
const OFF_LANES: usize = 16;
const OFF_CAPACITY: usize = 20;
const OFF_RECORDS: usize = 40;
const OFF_DOORBELL: usize = 48;
const OFF_BELL_PROBE: usize = 56;
/// Extracted integer fields per record.
pub const MAX_FIELDS: usize = 8;

/// A mapped ring.
pub struct Ring {
    base: *mut u8,
    len: usize,
    lanes: usize,
    capacity: u64,
    records: usize,
    /// The shared lane is being written.
    shared_busy: AtomicBool,
}

// SAFETY: the mapping is process-wide memory; every access happens with the GIL held (the
// crate's invariant), and the counters other processes read are atomics.
unsafe impl Send for Ring {}
// SAFETY: as above.
unsafe impl Sync for Ring {}

impl Ring {
    /// Maps the ring file at `path` and checks its header against its size.
    pub fn open(path: &str) -> std::io::Result<Ring> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)?;
        let len = file.metadata()?.len() as usize;
        let invalid =
            |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
        if len < CONTROL {
            return Err(invalid("shorter than a ring's header"));
        }
        // SAFETY: a shared read-write mapping of a file we opened read-write, of its size.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let mut ring = Ring {
            base: base.cast(),
            len,
            lanes: 0,
            capacity: 0,
            records: 0,
            shared_busy: AtomicBool::new(false),
        };
        let u32_at = |o: usize| ring.u32(o).load(Ordering::Relaxed);
        let (record_size, lanes, capacity) = (
            u32_at(OFF_RECORD_SIZE) as usize,
            u32_at(OFF_LANES) as usize,
            u32_at(OFF_CAPACITY) as usize,
        );
        let records = ring.u64(OFF_RECORDS).load(Ordering::Relaxed) as usize;
        let fits = lanes
            .checked_mul(capacity)
            .and_then(|n| n.checked_mul(RECORD_SIZE))
            .and_then(|n| n.checked_add(records))
            .is_some_and(|end| end <= len);
        if ring.u64(0).load(Ordering::Relaxed) != MAGIC
            || record_size != RECORD_SIZE
            || lanes == 0
            || LANE_BASE + LANE_SIZE * lanes > CONTROL
            || capacity == 0
            || records < CONTROL
            || !records.is_multiple_of(8)
            || !fits
        {
            ring.unmap();
            return Err(invalid(
                "not a stallscope ring, or its header does not fit the file",
            ));
        }
        ring.lanes = lanes;
        ring.capacity = capacity as u64;
        ring.records = records;
        Ok(ring)
    }

    pub fn lanes(&self) -> usize {
        self.lanes
    }

    fn u64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(8) && off + 8 <= self.len);
        // SAFETY: an 8-aligned offset inside the mapping (header, lane counters, or a record
        // slot, all checked against the length in `open`).
        unsafe { &*self.base.add(off).cast::<AtomicU64>() }
    }

    fn u32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: as for `u64`.
        unsafe { &*self.base.add(off).cast::<AtomicU32>() }
    }

    fn lane_word(lane: usize) -> usize {
        LANE_BASE + LANE_SIZE * lane
    }

    /// Marks `lane` as `tid`'s (the shared last lane has no owner).
    pub fn claim(&self, lane: usize, tid: u64) {
        if lane + 1 < self.lanes {
            self.u64(Self::lane_word(lane) + 24)
                .store(tid, Ordering::Relaxed);
        }
    }

    /// Counts a record that could not be written.
    pub fn lose(&self, lane: usize) {
        self.u64(Self::lane_word(lane) + 16)
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Writes one record into `lane` (never blocks: a full lane or a busy shared lane counts
    /// a lost record) and rings the doorbell if its watch is the one chosen.
    #[allow(clippy::too_many_arguments)]
    pub fn put(
        &self,
        lane: usize,
        tid: u64,
        probe: u32,
        flags: u32,
        t0: u64,
        t1: u64,
        fields: Option<&[i64; MAX_FIELDS]>,
    ) {
        let shared = lane + 1 == self.lanes;
        if shared && self.shared_busy.swap(true, Ordering::Acquire) {
            self.lose(lane);
            return;
        }
        let word = Self::lane_word(lane);
        let seq = self.u64(word).load(Ordering::Relaxed);
        let read = self.u64(word + 8).load(Ordering::Acquire);
        let written = seq.wrapping_sub(read) < self.capacity;
        if !written {
            self.lose(lane);
        } else {
            let slot = self.records
                + RECORD_SIZE * (lane * self.capacity as usize + (seq % self.capacity) as usize);
            self.u64(slot).store(seq, Ordering::Relaxed);
            self.u64(slot + 8)
                .store(u64::from(probe) | u64::from(flags) << 32, Ordering::Relaxed);
            self.u64(slot + 16).store(tid, Ordering::Relaxed);
            self.u64(slot + 24).store(t0, Ordering::Relaxed);
            self.u64(slot + 32).store(t1, Ordering::Relaxed);
            if let Some(values) = fields {
                for (i, v) in values.iter().enumerate() {
                    self.u64(slot + 40 + 8 * i)
                        .store(*v as u64, Ordering::Relaxed);
                }
            }
            self.u64(word).store(seq + 1, Ordering::Release);
        }
        if shared {
            self.shared_busy.store(false, Ordering::Release);
        }
        if written && self.u64(OFF_BELL_PROBE).load(Ordering::Relaxed) == u64::from(probe) + 1 {
            self.u32(OFF_DOORBELL).fetch_add(1, Ordering::Release);
            // The doorbell changes after the write sequence, so a reader woken by it finds the
            // record.
            // SAFETY: FUTEX_WAKE on a 4-aligned word of the shared mapping (not private: the
            // reader waits on the same file page in another process).
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    self.base.add(OFF_DOORBELL),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
    }

    /// Unmaps the ring; the caller writes nothing to it after.
    pub fn unmap(&self) {
        // SAFETY: base/len are the mapping made in `open`; callers stop using it (Writer::close
        // sets `closed` first, under the GIL).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
