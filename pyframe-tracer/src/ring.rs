//! The shared-memory ring between the injected probe (producer) and stallscope (consumer).
//!
//! One file in the target's `/dev/shm` (or `/tmp`), mapped by both sides. The producer side is written in Python
//! (`probe.py`), which documents the same layout. Lanes: each Python thread that calls a watched function claims
//! its own lane (single producer, no lock); threads beyond the exclusive lanes share the last lane through a
//! non-blocking lock. The producer never blocks: a full lane counts a lost record. Each lane publishes its write
//! sequence after the record bytes, and x86-64 keeps stores in order, so a record below `write_seq` is complete.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::MmapMut;

/// "STLSCPR1" read as a little-endian u64.
pub const MAGIC: u64 = 0x3152_5043_534C_5453;
/// Layout version (bump with probe.py's PROBE_VERSION when the layout changes).
pub const VERSION: u32 = 2;
/// Bytes per record.
pub const RECORD_SIZE: usize = 128;
/// Extracted integer fields per record.
pub const MAX_FIELDS: usize = 8;
const LANE_BASE: usize = 256;
const LANE_SIZE: usize = 64;
/// Offset of the probe's response area.
const CONTROL: usize = 4096;
/// Most lanes a ring holds: their counters fill the page below the response area.
pub const MAX_LANES: usize = (CONTROL - LANE_BASE) / LANE_SIZE;
/// Offset of the first record.
const RECORDS: usize = 65536;
const OFF_HEARTBEAT: usize = 24;
const OFF_STATE: usize = 32;
/// The doorbell: a 32-bit futex word the probe increments, then wakes, after a record of
/// [`OFF_BELL_PROBE`]'s watch (the reader waits on it instead of polling).
const OFF_DOORBELL: usize = 48;
/// 1 + the watch whose records ring the doorbell; 0 rings it for none.
const OFF_BELL_PROBE: usize = 56;

/// One timed call of a watched function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    /// Per-lane sequence number.
    pub seq: u64,
    /// Which watch (index into the attach response's probes).
    pub probe: u32,
    /// The call ended with an exception.
    pub exception: bool,
    /// Native thread id of the caller.
    pub tid: u64,
    /// CLOCK_MONOTONIC ns at entry.
    pub enter_ns: u64,
    /// CLOCK_MONOTONIC ns at exit.
    pub exit_ns: u64,
    /// Bit i set when field i was extracted.
    pub present: u8,
    /// Extracted fields, in the watch spec's order.
    pub fields: [i64; MAX_FIELDS],
}

impl Record {
    /// Field `i`, if it was extracted.
    pub fn field(&self, i: usize) -> Option<i64> {
        (i < MAX_FIELDS && self.present & (1 << i) != 0).then(|| self.fields[i])
    }

    /// Decodes a record from its 104 meaningful bytes.
    pub fn decode(b: &[u8]) -> Record {
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let flags = u32::from_le_bytes(b[12..16].try_into().unwrap());
        let mut fields = [0i64; MAX_FIELDS];
        for (i, f) in fields.iter_mut().enumerate() {
            *f = u64_at(40 + 8 * i) as i64;
        }
        Record {
            seq: u64_at(0),
            probe: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            exception: flags & 1 != 0,
            tid: u64_at(16),
            enter_ns: u64_at(24),
            exit_ns: u64_at(32),
            present: (flags >> 8) as u8,
            fields,
        }
    }

    /// Encodes the record (the producer's side; used by tests and benchmarks of the reader).
    pub fn encode(&self, out: &mut [u8]) {
        out[0..8].copy_from_slice(&self.seq.to_le_bytes());
        out[8..12].copy_from_slice(&self.probe.to_le_bytes());
        let flags = self.exception as u32 | (self.present as u32) << 8;
        out[12..16].copy_from_slice(&flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.tid.to_le_bytes());
        out[24..32].copy_from_slice(&self.enter_ns.to_le_bytes());
        out[32..40].copy_from_slice(&self.exit_ns.to_le_bytes());
        for (i, f) in self.fields.iter().enumerate() {
            out[40 + 8 * i..48 + 8 * i].copy_from_slice(&f.to_le_bytes());
        }
    }
}

/// The consumer side of a ring file.
///
/// Everything in the mapping but the records' bytes is trusted only as far as it is checked:
/// the target can write any value into its lanes' counters (a bug, or memory it scribbled on),
/// so a lane that claims more records than it holds is read once around and the rest counted
/// as lost ([`Ring::lost`]), and no offset is ever taken from the mapping unchecked.
pub struct Ring {
    path: PathBuf,
    map: MmapMut,
    /// The file of a ring this process created, holding its lock (see [`Ring::create`]).
    _file: Option<File>,
    lanes: usize,
    capacity: usize,
    /// Records skipped because a lane's counters claimed more than the lane can hold.
    overrun: AtomicU64,
    /// Times a lane's write sequence was found below its read sequence.
    resyncs: AtomicU64,
    /// Held by the drain in progress.
    draining: std::sync::Mutex<()>,
}

impl Ring {
    /// Creates (replacing) a ring file with `lanes` lanes of `capacity` records each and maps
    /// it.
    ///
    /// The file carries an exclusive `flock` for as long as this `Ring` lives, taken before
    /// the file has its name ([`sys_util::lock::create_locked`]): a ring file whose lock is
    /// free belongs to no live attach and can be removed by anyone ([`crate::reap`]), whatever
    /// its age.
    pub fn create(path: &Path, lanes: usize, capacity: usize) -> std::io::Result<Ring> {
        assert!((2..=MAX_LANES).contains(&lanes) && capacity > 0);
        let file = sys_util::lock::create_locked(path)?;
        let size = RECORDS + lanes * capacity * RECORD_SIZE;
        file.set_len(size as u64)?;
        // SAFETY: the file was just created at this size; only this process and the probe map it, and all
        // concurrent accesses go through volatile reads/writes of plain integers.
        let mut map = unsafe { MmapMut::map_mut(&file)? };
        map[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        map[8..12].copy_from_slice(&VERSION.to_le_bytes());
        map[12..16].copy_from_slice(&(RECORD_SIZE as u32).to_le_bytes());
        map[16..20].copy_from_slice(&(lanes as u32).to_le_bytes());
        map[20..24].copy_from_slice(&(capacity as u32).to_le_bytes());
        map[40..48].copy_from_slice(&(RECORDS as u64).to_le_bytes());
        let ring = Ring {
            path: path.to_path_buf(),
            map,
            _file: Some(file),
            lanes,
            capacity,
            overrun: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            draining: std::sync::Mutex::new(()),
        };
        ring.heartbeat(sys_util::clock::monotonic_ns());
        Ok(ring)
    }

    /// Opens an existing ring file (for tools that read a ring another process created).
    pub fn open(path: &Path) -> std::io::Result<Ring> {
        let file: File = OpenOptions::new().read(true).write(true).open(path)?;
        // SAFETY: as in `create`.
        let map = unsafe { MmapMut::map_mut(&file)? };
        Ring::from_mapping(path, map)
    }

    /// Reads the ring in `map` (a file's mapping, or an anonymous one in tests and fuzzing),
    /// refusing a header whose lanes or capacity do not fit the mapping. `path` names it in
    /// errors.
    pub fn from_mapping(path: &Path, map: MmapMut) -> std::io::Result<Ring> {
        let bad = |why: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is not a stallscope ring: {why}", path.display()),
            )
        };
        if map.len() < RECORDS || u64::from_le_bytes(map[0..8].try_into().unwrap()) != MAGIC {
            return Err(bad("no ring header"));
        }
        let lanes = u32::from_le_bytes(map[16..20].try_into().unwrap()) as usize;
        let capacity = u32::from_le_bytes(map[20..24].try_into().unwrap()) as usize;
        if !(2..=MAX_LANES).contains(&lanes) || capacity == 0 {
            return Err(bad(&format!("{lanes} lanes of {capacity} records")));
        }
        // lanes <= 60 and capacity < 2^32: the product fits in 64 bits.
        if map.len() < RECORDS + lanes * capacity * RECORD_SIZE {
            return Err(bad(&format!(
                "{lanes} lanes of {capacity} records do not fit in {} bytes",
                map.len()
            )));
        }
        Ok(Ring {
            path: path.to_path_buf(),
            map,
            _file: None,
            lanes,
            capacity,
            overrun: AtomicU64::new(0),
            resyncs: AtomicU64::new(0),
            draining: std::sync::Mutex::new(()),
        })
    }

    /// The ring's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn load(&self, off: usize) -> u64 {
        // SAFETY: `off` is 8-aligned inside the mapping; the other side writes it concurrently.
        unsafe { std::ptr::read_volatile(self.map.as_ptr().add(off) as *const u64) }
    }

    fn store(&self, off: usize, v: u64) {
        // SAFETY: as in `load`.
        unsafe { std::ptr::write_volatile(self.map.as_ptr().add(off) as *mut u64, v) }
    }

    /// Publishes that the reader is alive (CLOCK_MONOTONIC ns). The probe removes itself when this goes stale.
    pub fn heartbeat(&self, now_ns: u64) {
        self.store(OFF_HEARTBEAT, now_ns);
    }

    /// The last heartbeat written.
    #[cfg(test)]
    pub(crate) fn read_heartbeat(&self) -> u64 {
        self.load(OFF_HEARTBEAT)
    }

    /// The doorbell word, for [`sys_util::futex::wait_any`]: read it before draining, then
    /// wait for it to change.
    pub fn doorbell(&self) -> &AtomicU32 {
        // SAFETY: OFF_DOORBELL is 4-aligned inside the mapping, which lives as long as `self`;
        // the probe changes the word only by whole aligned stores.
        unsafe { &*(self.map.as_ptr().add(OFF_DOORBELL) as *const AtomicU32) }
    }

    /// Has the probe ring the doorbell after each record of `probe` (None: of no watch). The
    /// records that decide something, the anchor's, are the ones worth a wake.
    pub fn ring_on(&self, probe: Option<u32>) {
        self.store(OFF_BELL_PROBE, probe.map_or(0, |p| u64::from(p) + 1));
    }

    /// Probe state: 0 never attached, 1 attached, 2 detached.
    pub fn probe_state(&self) -> u64 {
        self.load(OFF_STATE)
    }

    /// Records lost: the lanes' own counters (a full lane) plus the records this reader
    /// skipped because a lane's counters claimed more than the lane holds.
    pub fn lost(&self) -> u64 {
        (0..self.lanes)
            .map(|l| self.load(LANE_BASE + LANE_SIZE * l + 16))
            .fold(self.overrun.load(Ordering::Relaxed), u64::saturating_add)
    }

    /// Times a lane's write sequence was found below its read sequence (nothing read from it
    /// then; a sign of a target writing over the ring).
    pub fn resyncs(&self) -> u64 {
        self.resyncs.load(Ordering::Relaxed)
    }

    /// Moves every complete record into `out`; returns how many. Calls from several threads
    /// take turns (each lane's read sequence is read, advanced and stored by one at a time).
    pub fn drain(&self, out: &mut Vec<Record>) -> usize {
        let _turn = self.draining.lock().unwrap_or_else(|e| e.into_inner());
        let before = out.len();
        for lane in 0..self.lanes {
            let lane_off = LANE_BASE + LANE_SIZE * lane;
            let write = self.load(lane_off);
            fence(Ordering::Acquire);
            let mut read = self.load(lane_off + 8);
            // The producer never runs more than `capacity` ahead. A lane that says it did has
            // corrupt counters: it is read once around from `write` backwards (bounding this
            // call) and the rest counted as lost. A write sequence below the read one is
            // waited out (nothing read, the read sequence kept), never followed backwards:
            // that would read records again.
            if write < read {
                self.resyncs.fetch_add(1, Ordering::Relaxed);
            } else if write - read > self.capacity as u64 {
                self.overrun
                    .fetch_add(write - read - self.capacity as u64, Ordering::Relaxed);
                read = write - self.capacity as u64;
            }
            while read < write {
                let off = RECORDS
                    + RECORD_SIZE * (lane * self.capacity + (read % self.capacity as u64) as usize);
                let mut bytes = [0u8; RECORD_SIZE];
                // SAFETY: in bounds; the producer does not rewrite this slot until read_seq passes it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.map.as_ptr().add(off),
                        bytes.as_mut_ptr(),
                        RECORD_SIZE,
                    )
                };
                out.push(Record::decode(&bytes));
                read += 1;
            }
            fence(Ordering::Release);
            self.store(lane_off + 8, read);
        }
        out.len() - before
    }

    /// The probe's response to request `seq`, once it has written it.
    pub fn response(&self, seq: u64) -> Option<String> {
        if self.load(CONTROL) != seq {
            return None;
        }
        fence(Ordering::Acquire);
        let len = (self.load(CONTROL + 8) as u32 as usize).min(RECORDS - CONTROL - 16);
        Some(String::from_utf8_lossy(&self.map[CONTROL + 16..CONTROL + 16 + len]).into_owned())
    }

    /// Test/benchmark producer: appends one record to `lane` as the probe would. Returns false when full.
    pub fn push(&mut self, lane: usize, rec: &Record) -> bool {
        let lane_off = LANE_BASE + LANE_SIZE * lane;
        let write = self.load(lane_off);
        if write - self.load(lane_off + 8) >= self.capacity as u64 {
            self.store(lane_off + 16, self.load(lane_off + 16) + 1);
            return false;
        }
        let off = RECORDS
            + RECORD_SIZE * (lane * self.capacity + (write % self.capacity as u64) as usize);
        rec.encode(&mut self.map[off..off + RECORD_SIZE]);
        fence(Ordering::Release);
        self.store(lane_off, write + 1);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> Record {
        Record {
            seq,
            probe: 3,
            exception: seq % 2 == 1,
            tid: 42,
            enter_ns: 10 * seq,
            exit_ns: 10 * seq + 5,
            present: 0b101,
            fields: [seq as i64, 0, -7, 0, 0, 0, 0, i64::MIN],
        }
    }

    #[test]
    fn records_round_trip_in_order_and_full_lanes_count_losses() {
        let dir = std::env::temp_dir().join(format!("ring-test-{}", std::process::id()));
        let mut ring = Ring::create(&dir, 2, 4).unwrap();
        for s in 0..6 {
            let pushed = ring.push(0, &rec(s));
            assert_eq!(pushed, s < 4, "record {s}");
        }
        assert_eq!(ring.lost(), 2);
        let mut out = Vec::new();
        assert_eq!(ring.drain(&mut out), 4);
        assert_eq!(out, (0..4).map(rec).collect::<Vec<_>>());
        assert_eq!(out[0].field(2), Some(-7));
        assert_eq!(out[0].field(1), None);
        // Room again after the drain; wrap-around keeps order.
        for s in 4..8 {
            assert!(ring.push(0, &rec(s)));
        }
        out.clear();
        ring.drain(&mut out);
        assert_eq!(
            out.iter().map(|r| r.seq).collect::<Vec<_>>(),
            vec![4, 5, 6, 7]
        );
        let reopened = Ring::open(&dir).unwrap();
        assert_eq!(reopened.lost(), 2);
        assert!(
            sys_util::lock::held(&dir),
            "the creator holds its ring's lock"
        );
        drop((ring, reopened));
        assert!(
            !sys_util::lock::held(&dir),
            "the lock goes with the creator's Ring"
        );
        std::fs::remove_file(&dir).unwrap();
    }

    #[test]
    fn corrupt_counters_are_read_once_around_and_counted_lost() {
        let path = Path::new("corrupt-ring");
        let mut map = MmapMut::map_anon(RECORDS + 2 * 4 * RECORD_SIZE).unwrap();
        map[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        map[16..20].copy_from_slice(&2u32.to_le_bytes());
        map[20..24].copy_from_slice(&4u32.to_le_bytes());
        let ring = Ring::from_mapping(path, map).unwrap();
        // Lane 0 claims a billion records; lane 1's write sequence is below its read one.
        ring.store(LANE_BASE, 1_000_000_000);
        ring.store(LANE_BASE + LANE_SIZE, 5);
        ring.store(LANE_BASE + LANE_SIZE + 8, 9);
        let mut out = Vec::new();
        assert_eq!(
            ring.drain(&mut out),
            4,
            "one lap of lane 0, nothing of lane 1"
        );
        assert_eq!(ring.lost(), 1_000_000_000 - 4);
        assert_eq!(ring.resyncs(), 1);
        // The lanes are consistent again: nothing more to read.
        assert_eq!(ring.drain(&mut out), 0);
    }

    #[test]
    fn headers_that_do_not_fit_are_refused() {
        for (lanes, capacity, extra) in [
            (0u32, 4u32, 1024),
            (61, 1, 1 << 20),
            (2, 0, 0),
            (2, 5, 1024),
            (u32::MAX, u32::MAX, 0),
        ] {
            let mut map = MmapMut::map_anon(RECORDS + extra).unwrap();
            map[0..8].copy_from_slice(&MAGIC.to_le_bytes());
            map[16..20].copy_from_slice(&lanes.to_le_bytes());
            map[20..24].copy_from_slice(&capacity.to_le_bytes());
            let err = Ring::from_mapping(Path::new("r"), map).err();
            assert!(err.is_some(), "{lanes} x {capacity} in {extra} bytes");
        }
    }
}
