//! The shared-memory channel from the injected agent (producer) to the daemon (consumer).
//!
//! One file, created by the daemon in the target's `/dev/shm` as `stallscope-gpu-<pid>` before
//! the agent is loaded, and mapped by both. A 4 KiB header (state, control word, sequence
//! numbers, loss counters, CUPTI version and subscription mode, the sampling the daemon asks
//! for, the agent's last error) is followed by a ring of fixed 64-byte [`Event`] slots. Single
//! producer (the agent serialises its CUPTI callbacks), single consumer; the producer never blocks: a full ring counts a lost event. x86-64 keeps stores
//! in order, and `write_seq` is published with release ordering after the slot bytes.

use std::sync::{
    atomic::{AtomicU32, AtomicU64, Ordering},
    Arc,
};

use crate::record::{Api, ApiDomain, Memcpy, Memset, Synchronization};

/// Magic at the start of the file.
pub const MAGIC: u64 = u64::from_le_bytes(*b"SSGPUCH1");
/// Bytes of the header.
pub const HEADER: usize = 4096;
/// Bytes of one slot.
pub const SLOT: usize = 64;
/// Longest error text the agent can leave.
pub const ERROR_LEN: usize = 1024;
/// Name bytes carried by one [`Event::NameChunk`].
pub const NAME_CHUNK: usize = 40;

/// The file name for the agent of process `pid` (under `/dev/shm`).
pub fn file_name(pid: u32) -> String {
    format!("stallscope-gpu-{pid}")
}

/// Bytes of a channel file with `slots` slots.
pub fn file_len(slots: usize) -> usize {
    HEADER + slots * SLOT
}

/// Agent states, as written to the header.
pub mod state {
    /// Loaded, not yet subscribed.
    pub const STARTING: u32 = 0;
    /// Subscribed, records flowing.
    pub const RUNNING: u32 = 1;
    /// Gave up; the error text says why. Nothing of CUPTI is held.
    pub const FAILED: u32 = 2;
    /// Disabled, flushed and unsubscribed after a detach request (or a lost daemon): the
    /// library can be unloaded.
    pub const DETACHED: u32 = 3;
}

/// Header fields (byte offsets; every field 8-byte aligned).
mod hdr {
    pub const MAGIC: usize = 0;
    pub const SLOTS: usize = 8;
    pub const STATE: usize = 16;
    pub const CONTROL: usize = 20;
    pub const WRITE_SEQ: usize = 24;
    pub const READ_SEQ: usize = 32;
    pub const LOST: usize = 40;
    pub const CUPTI_DROPPED: usize = 48;
    pub const HEARTBEAT: usize = 56;
    pub const CUPTI_VERSION: usize = 64;
    pub const AGENT_TID: usize = 72;
    pub const SUBSCRIPTION: usize = 76;
    pub const SAMPLING: usize = 80;
    pub const ERROR: usize = 128;
}

/// The control word: what the daemon asks of the agent.
pub mod control {
    /// Keep tracing.
    pub const RUN: u32 = 0;
    /// Disable, flush, unsubscribe and stop.
    pub const DETACH: u32 = 1;
}

/// One event through the channel: CUPTI activity with kernel names replaced by ids, plus the
/// agent's own name and clock records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A kernel; its name arrives as [`Event::NameChunk`]s before it.
    Kernel {
        /// Start (CUPTI clock, ns).
        start: u64,
        /// End.
        end: u64,
        /// Device index.
        device_id: u32,
        /// Stream id.
        stream_id: u32,
        /// Correlation id (joins the launching API call).
        correlation_id: u32,
        /// Interned name id.
        name_id: u32,
        /// Threads in the grid (grid × block volume).
        threads: u64,
        /// CUDA graph id (0 outside graphs).
        graph_id: u32,
    },
    /// A memory copy.
    Memcpy(Memcpy),
    /// A memset.
    Memset(Memset),
    /// A driver or runtime API call.
    Api(Api),
    /// A host synchronization.
    Synchronization(Synchronization),
    /// An external correlation.
    ExternalCorrelation {
        /// Kind of the external id.
        external_kind: u32,
        /// The external id.
        external_id: u64,
        /// The CUPTI correlation id.
        correlation_id: u32,
    },
    /// Part of an interned kernel name: bytes `offset..offset + len` of name `id`, whose full
    /// length is `total`.
    NameChunk {
        /// Name id.
        id: u32,
        /// Offset of this chunk.
        offset: u32,
        /// Full length.
        total: u32,
        /// Bytes in this chunk.
        len: u8,
        /// The bytes (first `len` used).
        bytes: [u8; NAME_CHUNK],
    },
    /// The agent turned its activity kinds on (stamped once they are all on) or off
    /// (stamped before the first goes off): between an on and the next off, every launch was
    /// traced ([`crate::sampling`]).
    Tracing {
        /// On or off.
        on: bool,
        /// CLOCK_MONOTONIC ns.
        at_ns: u64,
    },
    /// A clock calibration sample: CUPTI's clock read between two CLOCK_MONOTONIC reads.
    Clock {
        /// cuptiGetTimestamp.
        cupti_ns: u64,
        /// CLOCK_MONOTONIC before it.
        mono_before_ns: u64,
        /// CLOCK_MONOTONIC after it.
        mono_after_ns: u64,
    },
}

mod tag {
    pub const KERNEL: u32 = 1;
    pub const MEMCPY: u32 = 2;
    pub const MEMSET: u32 = 3;
    pub const API_DRIVER: u32 = 4;
    pub const API_RUNTIME: u32 = 5;
    pub const SYNC: u32 = 6;
    pub const EXT_CORR: u32 = 7;
    pub const NAME: u32 = 8;
    pub const CLOCK: u32 = 9;
    pub const TRACING: u32 = 10;
}

/// Slot layout: tag u32, three u32 words, then six u64 words.
#[derive(Default)]
struct Words {
    tag: u32,
    w: [u32; 3],
    q: [u64; 6],
}

impl Words {
    fn write(&self, out: &mut [u8; SLOT]) {
        out[0..4].copy_from_slice(&self.tag.to_le_bytes());
        for (i, w) in self.w.iter().enumerate() {
            out[4 + 4 * i..8 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        for (i, q) in self.q.iter().enumerate() {
            out[16 + 8 * i..24 + 8 * i].copy_from_slice(&q.to_le_bytes());
        }
    }

    fn read(b: &[u8; SLOT]) -> Words {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        Words {
            tag: u32_at(0),
            w: [u32_at(4), u32_at(8), u32_at(12)],
            q: std::array::from_fn(|i| u64_at(16 + 8 * i)),
        }
    }
}

impl Event {
    /// The slot bytes of this event.
    pub fn encode(&self) -> [u8; SLOT] {
        let w = match *self {
            Event::Kernel {
                start,
                end,
                device_id,
                stream_id,
                correlation_id,
                name_id,
                threads,
                graph_id,
            } => Words {
                tag: tag::KERNEL,
                w: [stream_id, correlation_id, device_id],
                q: [start, end, name_id as u64, threads, graph_id as u64, 0],
            },
            Event::Memcpy(m) => Words {
                tag: tag::MEMCPY,
                w: [m.stream_id, m.correlation_id, m.device_id],
                q: [
                    m.start,
                    m.end,
                    m.bytes,
                    u64::from(m.copy_kind)
                        | u64::from(m.src_kind) << 8
                        | u64::from(m.dst_kind) << 16,
                    m.context_id as u64,
                    0,
                ],
            },
            Event::Memset(m) => Words {
                tag: tag::MEMSET,
                w: [m.stream_id, m.correlation_id, m.device_id],
                q: [
                    m.start,
                    m.end,
                    m.bytes,
                    u64::from(m.value) | u64::from(m.memory_kind) << 32,
                    m.context_id as u64,
                    0,
                ],
            },
            Event::Api(a) => Words {
                tag: if a.domain == ApiDomain::Driver {
                    tag::API_DRIVER
                } else {
                    tag::API_RUNTIME
                },
                w: [a.thread_id, a.correlation_id, a.cbid],
                q: [
                    a.start,
                    a.end,
                    a.return_value as u64,
                    a.process_id as u64,
                    0,
                    0,
                ],
            },
            Event::Synchronization(s) => Words {
                tag: tag::SYNC,
                w: [s.stream_id, s.correlation_id, s.sync_type],
                q: [
                    s.start,
                    s.end,
                    s.cuda_event_id as u64,
                    s.context_id as u64,
                    0,
                    0,
                ],
            },
            Event::ExternalCorrelation {
                external_kind,
                external_id,
                correlation_id,
            } => Words {
                tag: tag::EXT_CORR,
                w: [0, correlation_id, external_kind],
                q: [external_id, 0, 0, 0, 0, 0],
            },
            Event::NameChunk {
                id,
                offset,
                total,
                len,
                bytes,
            } => {
                let mut q = [0u64; 6];
                q[0] = u64::from(len);
                for (i, c) in bytes.chunks(8).enumerate() {
                    q[1 + i] = u64::from_le_bytes(c.try_into().expect("8"));
                }
                Words {
                    tag: tag::NAME,
                    w: [id, offset, total],
                    q,
                }
            }
            Event::Clock {
                cupti_ns,
                mono_before_ns,
                mono_after_ns,
            } => Words {
                tag: tag::CLOCK,
                w: [0; 3],
                q: [cupti_ns, mono_before_ns, mono_after_ns, 0, 0, 0],
            },
            Event::Tracing { on, at_ns } => Words {
                tag: tag::TRACING,
                w: [u32::from(on), 0, 0],
                q: [at_ns, 0, 0, 0, 0, 0],
            },
        };
        let mut out = [0u8; SLOT];
        w.write(&mut out);
        out
    }

    /// The event in a slot; `None` for an unknown tag.
    pub fn decode(b: &[u8; SLOT]) -> Option<Event> {
        let Words { tag, w, q } = Words::read(b);
        Some(match tag {
            tag::KERNEL => Event::Kernel {
                start: q[0],
                end: q[1],
                device_id: w[2],
                stream_id: w[0],
                correlation_id: w[1],
                name_id: q[2] as u32,
                threads: q[3],
                graph_id: q[4] as u32,
            },
            tag::MEMCPY => Event::Memcpy(Memcpy {
                copy_kind: q[3] as u8,
                src_kind: (q[3] >> 8) as u8,
                dst_kind: (q[3] >> 16) as u8,
                bytes: q[2],
                start: q[0],
                end: q[1],
                device_id: w[2],
                context_id: q[4] as u32,
                stream_id: w[0],
                correlation_id: w[1],
            }),
            tag::MEMSET => Event::Memset(Memset {
                value: q[3] as u32,
                bytes: q[2],
                start: q[0],
                end: q[1],
                device_id: w[2],
                context_id: q[4] as u32,
                stream_id: w[0],
                correlation_id: w[1],
                memory_kind: (q[3] >> 32) as u16,
            }),
            tag::API_DRIVER | tag::API_RUNTIME => Event::Api(Api {
                domain: if tag == tag::API_DRIVER {
                    ApiDomain::Driver
                } else {
                    ApiDomain::Runtime
                },
                cbid: w[2],
                start: q[0],
                end: q[1],
                process_id: q[3] as u32,
                thread_id: w[0],
                correlation_id: w[1],
                return_value: q[2] as u32,
            }),
            tag::SYNC => Event::Synchronization(Synchronization {
                sync_type: w[2],
                start: q[0],
                end: q[1],
                correlation_id: w[1],
                context_id: q[3] as u32,
                stream_id: w[0],
                cuda_event_id: q[2] as u32,
            }),
            tag::EXT_CORR => Event::ExternalCorrelation {
                external_kind: w[2],
                external_id: q[0],
                correlation_id: w[1],
            },
            tag::NAME => {
                let mut bytes = [0u8; NAME_CHUNK];
                for i in 0..NAME_CHUNK / 8 {
                    bytes[8 * i..8 * i + 8].copy_from_slice(&q[1 + i].to_le_bytes());
                }
                Event::NameChunk {
                    id: w[0],
                    offset: w[1],
                    total: w[2],
                    len: (q[0] as u8).min(NAME_CHUNK as u8),
                    bytes,
                }
            }
            tag::CLOCK => Event::Clock {
                cupti_ns: q[0],
                mono_before_ns: q[1],
                mono_after_ns: q[2],
            },
            tag::TRACING => Event::Tracing {
                on: w[0] != 0,
                at_ns: q[0],
            },
            _ => return None,
        })
    }

    /// The chunks that carry `name` as name `id`.
    pub fn name_chunks(id: u32, name: &[u8]) -> impl Iterator<Item = Event> + '_ {
        name.chunks(NAME_CHUNK).enumerate().map(move |(i, c)| {
            let mut bytes = [0u8; NAME_CHUNK];
            bytes[..c.len()].copy_from_slice(c);
            Event::NameChunk {
                id,
                offset: (i * NAME_CHUNK) as u32,
                total: name.len() as u32,
                len: c.len() as u8,
                bytes,
            }
        })
    }
}

/// A mapped channel: the header and ring of one agent's file.
///
/// Both sides hold a `Channel` over the same shared mapping; the producer calls [`push`]
/// (from one thread at a time) and the consumer [`drain`].
///
/// [`push`]: Channel::push
/// [`drain`]: Channel::drain
///
/// The consumer trusts nothing the mapping holds beyond the magic and slot count checked at
/// [`Channel::open`]: a write sequence more than one ring ahead of the read one is read once
/// around and the rest counted lost, one below it is waited out.
pub struct Channel {
    base: *mut u8,
    slots: u64,
    /// The consumer's count of events skipped past a corrupt write sequence (shared by
    /// aliases).
    overrun: Arc<AtomicU64>,
}

// SAFETY: all shared fields are accessed through atomics or behind the sequence protocol.
unsafe impl Send for Channel {}
// SAFETY: as above; `push` is documented single-producer.
unsafe impl Sync for Channel {}

impl Channel {
    /// Formats a fresh channel in `mem` (zeroed by the caller, [`file_len`] bytes).
    ///
    /// # Safety
    /// `mem` must point to a writable mapping of `file_len(slots)` bytes that outlives the
    /// channel.
    pub unsafe fn init(mem: *mut u8, slots: usize) -> Channel {
        let c = Channel {
            base: mem,
            slots: slots as u64,
            overrun: Arc::default(),
        };
        c.u64_at(hdr::SLOTS).store(slots as u64, Ordering::Relaxed);
        c.u64_at(hdr::MAGIC).store(MAGIC, Ordering::Release);
        c
    }

    /// Opens a channel formatted by [`Channel::init`]; `None` when `mem` holds no channel
    /// or `len` is too short for its slot count.
    ///
    /// # Safety
    /// `mem` must point to a writable shared mapping of `len` bytes that outlives the channel.
    pub unsafe fn open(mem: *mut u8, len: usize) -> Option<Channel> {
        if len < HEADER {
            return None;
        }
        let probe = Channel {
            base: mem,
            slots: 0,
            overrun: Arc::default(),
        };
        if probe.u64_at(hdr::MAGIC).load(Ordering::Acquire) != MAGIC {
            return None;
        }
        let slots = probe.u64_at(hdr::SLOTS).load(Ordering::Relaxed);
        let fits = (len - HEADER) / SLOT;
        (slots > 0 && slots <= fits as u64).then_some(Channel { slots, ..probe })
    }

    /// A second handle on the same mapping.
    ///
    /// # Safety
    /// The handle must not be used after the mapping is gone.
    pub unsafe fn alias(&self) -> Channel {
        Channel {
            base: self.base,
            slots: self.slots,
            overrun: self.overrun.clone(),
        }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        // SAFETY: `off` is an 8-aligned header offset inside the mapping (page aligned).
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as above, 4-aligned.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// The agent's state (see [`state`]).
    pub fn state(&self) -> u32 {
        self.u32_at(hdr::STATE).load(Ordering::Acquire)
    }

    /// Sets the agent's state.
    pub fn set_state(&self, s: u32) {
        self.u32_at(hdr::STATE).store(s, Ordering::Release);
    }

    /// The control word (see [`control`]).
    pub fn control(&self) -> u32 {
        self.u32_at(hdr::CONTROL).load(Ordering::Acquire)
    }

    /// Sets the control word.
    pub fn set_control(&self, c: u32) {
        self.u32_at(hdr::CONTROL).store(c, Ordering::Release);
    }

    /// The daemon's last heartbeat (CLOCK_MONOTONIC ns; 0 before the first).
    pub fn heartbeat(&self) -> u64 {
        self.u64_at(hdr::HEARTBEAT).load(Ordering::Acquire)
    }

    /// Records a heartbeat.
    pub fn beat(&self, now_ns: u64) {
        self.u64_at(hdr::HEARTBEAT).store(now_ns, Ordering::Release);
    }

    /// Events lost: to a full ring (the producer's count), or skipped by the consumer past a
    /// corrupt write sequence.
    pub fn lost(&self) -> u64 {
        self.u64_at(hdr::LOST)
            .load(Ordering::Relaxed)
            .saturating_add(self.overrun.load(Ordering::Relaxed))
    }

    /// Records CUPTI reported dropped (its own buffers full).
    pub fn cupti_dropped(&self) -> u64 {
        self.u64_at(hdr::CUPTI_DROPPED).load(Ordering::Relaxed)
    }

    /// Adds to the CUPTI-dropped count.
    pub fn add_cupti_dropped(&self, n: u64) {
        self.u64_at(hdr::CUPTI_DROPPED)
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The CUPTI version the agent found (0 when unknown).
    pub fn cupti_version(&self) -> u32 {
        self.u64_at(hdr::CUPTI_VERSION).load(Ordering::Relaxed) as u32
    }

    /// Records the CUPTI version.
    pub fn set_cupti_version(&self, v: u32) {
        self.u64_at(hdr::CUPTI_VERSION)
            .store(v.into(), Ordering::Relaxed);
    }

    /// The agent thread's tid (0 before it starts): once it has left /proc, no code of the
    /// agent runs and the library can be unloaded.
    pub fn agent_tid(&self) -> u32 {
        self.u32_at(hdr::AGENT_TID).load(Ordering::Acquire)
    }

    /// Records the agent thread's tid.
    pub fn set_agent_tid(&self, tid: u32) {
        self.u32_at(hdr::AGENT_TID).store(tid, Ordering::Release);
    }

    /// How the agent subscribed ([`crate::subscription::Mode::code`]; 0 before it has).
    pub fn subscription(&self) -> u32 {
        self.u32_at(hdr::SUBSCRIPTION).load(Ordering::Acquire)
    }

    /// Records how the agent subscribed.
    pub fn set_subscription(&self, mode: u32) {
        self.u32_at(hdr::SUBSCRIPTION)
            .store(mode, Ordering::Release);
    }

    /// The share of the time the agent traces (the daemon's choice; always on until set).
    pub fn sampling(&self) -> crate::sampling::Sampling {
        crate::sampling::Sampling::from_word(self.u64_at(hdr::SAMPLING).load(Ordering::Acquire))
    }

    /// Sets the share of the time the agent traces; it follows within a flush period.
    pub fn set_sampling(&self, s: crate::sampling::Sampling) {
        self.u64_at(hdr::SAMPLING)
            .store(s.word(), Ordering::Release);
    }

    /// The agent's last error text.
    pub fn error(&self) -> String {
        // SAFETY: the error field lies inside the header.
        let b = unsafe { std::slice::from_raw_parts(self.base.add(hdr::ERROR), ERROR_LEN) };
        let end = b.iter().position(|&c| c == 0).unwrap_or(ERROR_LEN);
        String::from_utf8_lossy(&b[..end]).into_owned()
    }

    /// Leaves an error text (truncated to fit) and the FAILED state.
    pub fn fail(&self, msg: &str) {
        let n = msg.len().min(ERROR_LEN - 1);
        // SAFETY: the error field lies inside the header; only the agent writes it.
        unsafe {
            let dst = self.base.add(hdr::ERROR);
            std::ptr::copy_nonoverlapping(msg.as_ptr(), dst, n);
            *dst.add(n) = 0;
        }
        self.set_state(state::FAILED);
    }

    /// Appends one event; false (and counted as lost) when the ring is full. Single producer.
    pub fn push(&self, e: &Event) -> bool {
        let w = self.u64_at(hdr::WRITE_SEQ).load(Ordering::Relaxed);
        let r = self.u64_at(hdr::READ_SEQ).load(Ordering::Acquire);
        if w.wrapping_sub(r) >= self.slots {
            self.u64_at(hdr::LOST).fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let slot = e.encode();
        // SAFETY: the slot index is below `slots`, inside the mapping; the consumer does not
        // read it until `write_seq` passes it.
        unsafe {
            let dst = self.base.add(HEADER + (w % self.slots) as usize * SLOT);
            std::ptr::copy_nonoverlapping(slot.as_ptr(), dst, SLOT);
        }
        self.u64_at(hdr::WRITE_SEQ)
            .store(w.wrapping_add(1), Ordering::Release);
        true
    }

    /// Moves every published event into `out`; how many. Single consumer.
    pub fn drain(&self, out: &mut Vec<Event>) -> usize {
        let mut r = self.u64_at(hdr::READ_SEQ).load(Ordering::Relaxed);
        let w = self.u64_at(hdr::WRITE_SEQ).load(Ordering::Acquire);
        if w < r {
            // Waited out, never followed backwards (that would read events again).
            return 0;
        }
        if w - r > self.slots {
            self.overrun
                .fetch_add(w - r - self.slots, Ordering::Relaxed);
            r = w - self.slots;
        }
        for seq in r..w {
            let mut slot = [0u8; SLOT];
            // SAFETY: published slot inside the mapping; the producer does not reuse it until
            // `read_seq` passes it.
            unsafe {
                let src = self.base.add(HEADER + (seq % self.slots) as usize * SLOT);
                std::ptr::copy_nonoverlapping(src, slot.as_mut_ptr(), SLOT);
            }
            if let Some(e) = Event::decode(&slot) {
                out.push(e);
            }
        }
        self.u64_at(hdr::READ_SEQ).store(w, Ordering::Release);
        (w - r) as usize
    }
}

/// Longest name kept (longer ones, a C++ template's mangled name, are cut here).
pub const MAX_NAME: usize = 16 * 1024;
/// Names being reassembled at once (the agent sends one name's chunks in a row).
const MAX_PARTIAL: usize = 64;

/// Reassembles interned names from [`Event::NameChunk`]s.
#[derive(Debug, Default)]
pub struct Names {
    partial: std::collections::HashMap<u32, Vec<u8>>,
    done: std::collections::HashMap<u32, String>,
}

impl Names {
    /// Takes a chunk; true when it completed its name. A name is kept to [`MAX_NAME`] bytes;
    /// past [`MAX_PARTIAL`] names begun and unfinished, the unfinished ones are dropped.
    pub fn feed(&mut self, id: u32, offset: u32, total: u32, bytes: &[u8]) -> bool {
        if self.partial.len() >= MAX_PARTIAL && !self.partial.contains_key(&id) {
            self.partial.clear();
        }
        let buf = self
            .partial
            .entry(id)
            .or_insert_with(|| vec![0; (total as usize).min(MAX_NAME)]);
        let (o, n) = (offset as usize, bytes.len());
        if let Some(dst) = buf.get_mut(o..o + n) {
            dst.copy_from_slice(bytes);
        }
        if o + n >= total as usize {
            let b = self.partial.remove(&id).unwrap_or_default();
            self.done
                .insert(id, String::from_utf8_lossy(&b).into_owned());
            return true;
        }
        false
    }

    /// Takes `e` when it is a name chunk; `Some(id)` once it completed name `id`, `None`
    /// otherwise (and for any other event).
    pub fn take(&mut self, e: &Event) -> Option<u32> {
        match e {
            Event::NameChunk {
                id,
                offset,
                total,
                len,
                bytes,
            } => self
                .feed(*id, *offset, *total, &bytes[..usize::from(*len)])
                .then_some(*id),
            _ => None,
        }
    }

    /// Name `id`, once complete.
    pub fn get(&self, id: u32) -> Option<&str> {
        self.done.get(&id).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events() -> Vec<Event> {
        let mut v = vec![
            Event::Kernel {
                start: 10,
                end: 20,
                device_id: 1,
                stream_id: 7,
                correlation_id: 99,
                name_id: 3,
                threads: 1 << 20,
                graph_id: 0,
            },
            Event::Memcpy(Memcpy {
                copy_kind: 2,
                src_kind: 3,
                dst_kind: 1,
                bytes: 4096,
                start: 30,
                end: 40,
                device_id: 0,
                context_id: 1,
                stream_id: 7,
                correlation_id: 100,
            }),
            Event::Memset(Memset {
                value: 7,
                bytes: 64,
                start: 1,
                end: 2,
                device_id: 0,
                context_id: 1,
                stream_id: 7,
                correlation_id: 101,
                memory_kind: 3,
            }),
            Event::Api(Api {
                domain: ApiDomain::Runtime,
                cbid: 211,
                start: 5,
                end: 9,
                process_id: 42,
                thread_id: 43,
                correlation_id: 99,
                return_value: 0,
            }),
            Event::Synchronization(Synchronization {
                sync_type: 3,
                start: 50,
                end: 60,
                correlation_id: 102,
                context_id: 1,
                stream_id: 7,
                cuda_event_id: u32::MAX,
            }),
            Event::ExternalCorrelation {
                external_kind: 3,
                external_id: 1234567,
                correlation_id: 99,
            },
            Event::Clock {
                cupti_ns: 1_700_000_000_000_000_000,
                mono_before_ns: 5_000,
                mono_after_ns: 5_200,
            },
            Event::Tracing {
                on: true,
                at_ns: 9_000,
            },
            Event::Tracing {
                on: false,
                at_ns: 9_500,
            },
        ];
        v.extend(Event::name_chunks(
            3,
            b"void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
        ));
        v
    }

    /// The producer's and the consumer's channel over `mem` (`file_len(slots)` bytes).
    fn ends(mem: &mut [u64], slots: usize) -> (Channel, Channel) {
        assert_eq!(mem.len() * 8, file_len(slots));
        // SAFETY: `mem` is file_len(slots) bytes, 8-aligned, and outlives both channels in
        // every test.
        let tx = unsafe { Channel::init(mem.as_mut_ptr().cast(), slots) };
        // SAFETY: as above.
        let rx = unsafe { Channel::open(mem.as_mut_ptr().cast(), file_len(slots)) }.unwrap();
        (tx, rx)
    }

    #[test]
    fn events_round_trip_through_slots() {
        for e in events() {
            assert_eq!(Event::decode(&e.encode()), Some(e), "{e:?}");
        }
        assert_eq!(Event::decode(&[0xff; SLOT]), None);
    }

    #[test]
    fn the_ring_carries_events_in_order_and_counts_what_it_drops() {
        let slots = 4;
        let mut mem = vec![0u64; file_len(slots) / 8];
        let (tx, rx) = ends(&mut mem, slots);
        let ev = events();
        for e in &ev[..6] {
            tx.push(e);
        }
        assert_eq!(rx.lost(), 2);
        let mut out = Vec::new();
        assert_eq!(rx.drain(&mut out), 4);
        assert_eq!(out, ev[..4]);
        for e in &ev[4..] {
            tx.push(e);
        }
        out.clear();
        rx.drain(&mut out);
        assert_eq!(out, ev[4..8]);
        assert_eq!(rx.lost(), 2 + (ev.len() - 8) as u64);
    }

    #[test]
    fn corrupt_sequences_are_read_once_around() {
        let slots = 4;
        let mut mem = vec![0u64; file_len(slots) / 8];
        let (tx, rx) = ends(&mut mem, slots);
        tx.u64_at(hdr::WRITE_SEQ).store(u64::MAX, Ordering::Relaxed);
        let mut out = Vec::new();
        assert_eq!(rx.drain(&mut out), slots, "one lap, not 2^64 events");
        assert_eq!(rx.lost(), u64::MAX - slots as u64);
        // Backwards: waited out, nothing read, the read sequence kept.
        tx.u64_at(hdr::WRITE_SEQ).store(3, Ordering::Relaxed);
        assert_eq!(rx.drain(&mut out), 0);
        assert_eq!(rx.u64_at(hdr::READ_SEQ).load(Ordering::Relaxed), u64::MAX);
    }

    #[test]
    fn names_are_bounded() {
        let mut names = Names::default();
        // A name that says it is 4 GiB long takes MAX_NAME bytes; chunks past it are dropped.
        assert!(!names.feed(1, 0, u32::MAX, b"abc"));
        assert!(!names.feed(1, u32::MAX - 8, u32::MAX, b"xyz"));
        assert!(names.feed(1, u32::MAX - 3, u32::MAX, b"end"));
        assert_eq!(names.get(1).map(str::len), Some(MAX_NAME));
        // Unfinished names from many ids do not pile up.
        for id in 10..10_000 {
            names.feed(id, 0, 1000, b"x");
        }
        assert!(names.partial.len() <= MAX_PARTIAL);
    }

    #[test]
    fn names_are_reassembled_from_chunks() {
        let name =
            b"void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>";
        let mut names = Names::default();
        let mut complete = 0;
        for e in Event::name_chunks(3, name) {
            complete += usize::from(names.take(&e) == Some(3));
        }
        assert_eq!(complete, 1);
        assert_eq!(names.get(3), Some(std::str::from_utf8(name).unwrap()));
        assert_eq!(names.get(4), None);
    }

    #[test]
    fn header_fields_are_shared_and_errors_truncated() {
        let mut mem = vec![0u64; file_len(2) / 8];
        // SAFETY: sized and aligned as required; outlives the channels.
        let a = unsafe { Channel::init(mem.as_mut_ptr().cast(), 2) };
        // SAFETY: as above.
        let b = unsafe { Channel::open(mem.as_mut_ptr().cast(), file_len(2)) }.unwrap();
        a.set_control(control::DETACH);
        assert_eq!(b.control(), control::DETACH);
        b.beat(77);
        assert_eq!(a.heartbeat(), 77);
        assert!(b.sampling().always());
        let s: crate::sampling::Sampling = "1s/10s".parse().unwrap();
        b.set_sampling(s);
        assert_eq!(a.sampling(), s);
        a.fail(&"x".repeat(5000));
        assert_eq!(b.state(), state::FAILED);
        assert_eq!(b.error().len(), ERROR_LEN - 1);
        // SAFETY: too short for the slot count: refused.
        assert!(unsafe { Channel::open(mem.as_mut_ptr().cast(), file_len(1)) }.is_none());
        let mut zero = vec![0u64; HEADER / 8];
        // SAFETY: a zeroed buffer holds no channel.
        assert!(unsafe { Channel::open(zero.as_mut_ptr().cast(), HEADER) }.is_none());
    }
}
