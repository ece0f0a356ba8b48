//! CUPTI activity records decoded from (and, for the stand-in library and tests, encoded to)
//! their documented byte offsets.
//!
//! Every record starts with its `u32` kind. Only the fields stallscope uses are read; their
//! offsets are the same in CUpti_ActivityKernel9/10/13, Memcpy6/7, Memset4/5, API,
//! Synchronization2 and ExternalCorrelation (CUPTI 12.9 through 13.x), and newer versions only
//! append fields, so a record is read through a prefix of [`min_len`] bytes.

use crate::kind;

/// Byte offsets of the fields read, per record type (`tests/layout.rs` checks them against the
/// CUPTI headers).
pub mod offset {
    /// CUpti_ActivityKernel9 … 13 (kinds KERNEL and CONCURRENT_KERNEL).
    pub mod kernel {
        pub const REGISTERS_PER_THREAD: usize = 6;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE_ID: usize = 40;
        pub const CONTEXT_ID: usize = 44;
        pub const STREAM_ID: usize = 48;
        pub const GRID_X: usize = 52;
        pub const BLOCK_X: usize = 64;
        pub const STATIC_SHARED_MEMORY: usize = 76;
        pub const DYNAMIC_SHARED_MEMORY: usize = 80;
        pub const CORRELATION_ID: usize = 92;
        pub const NAME: usize = 104;
        pub const GRAPH_NODE_ID: usize = 144;
        pub const GRAPH_ID: usize = 156;
        /// Bytes up to the last field read.
        pub const LEN: usize = 160;
    }
    /// CUpti_ActivityMemcpy6/7.
    pub mod memcpy {
        pub const COPY_KIND: usize = 4;
        pub const SRC_KIND: usize = 5;
        pub const DST_KIND: usize = 6;
        pub const BYTES: usize = 8;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE_ID: usize = 32;
        pub const CONTEXT_ID: usize = 36;
        pub const STREAM_ID: usize = 40;
        pub const CORRELATION_ID: usize = 44;
        pub const LEN: usize = 48;
    }
    /// CUpti_ActivityMemset4/5.
    pub mod memset {
        pub const VALUE: usize = 4;
        pub const BYTES: usize = 8;
        pub const START: usize = 16;
        pub const END: usize = 24;
        pub const DEVICE_ID: usize = 32;
        pub const CONTEXT_ID: usize = 36;
        pub const STREAM_ID: usize = 40;
        pub const CORRELATION_ID: usize = 44;
        pub const MEMORY_KIND: usize = 50;
        pub const LEN: usize = 52;
    }
    /// CUpti_ActivityAPI (kinds DRIVER and RUNTIME).
    pub mod api {
        pub const CBID: usize = 4;
        pub const START: usize = 8;
        pub const END: usize = 16;
        pub const PROCESS_ID: usize = 24;
        pub const THREAD_ID: usize = 28;
        pub const CORRELATION_ID: usize = 32;
        pub const RETURN_VALUE: usize = 36;
        pub const LEN: usize = 40;
    }
    /// CUpti_ActivitySynchronization2.
    pub mod synchronization {
        pub const TYPE: usize = 4;
        pub const START: usize = 8;
        pub const END: usize = 16;
        pub const CORRELATION_ID: usize = 24;
        pub const CONTEXT_ID: usize = 28;
        pub const STREAM_ID: usize = 32;
        pub const CUDA_EVENT_ID: usize = 36;
        pub const LEN: usize = 40;
    }
    /// CUpti_ActivityExternalCorrelation.
    pub mod external_correlation {
        pub const EXTERNAL_KIND: usize = 4;
        pub const EXTERNAL_ID: usize = 8;
        pub const CORRELATION_ID: usize = 16;
        pub const LEN: usize = 20;
    }
}

/// A kernel execution (`KERNEL` or `CONCURRENT_KERNEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Kernel {
    /// GPU timestamps (CUPTI clock, ns).
    pub start: u64,
    /// End timestamp.
    pub end: u64,
    /// Device index.
    pub device_id: u32,
    /// Context id.
    pub context_id: u32,
    /// Stream id.
    pub stream_id: u32,
    /// Joins the kernel with the API call that launched it.
    pub correlation_id: u32,
    /// Grid dimensions.
    pub grid: [i32; 3],
    /// Block dimensions.
    pub block: [i32; 3],
    /// Registers per thread.
    pub registers_per_thread: u16,
    /// Static shared memory per block, bytes.
    pub static_shared_memory: i32,
    /// Dynamic shared memory per block, bytes.
    pub dynamic_shared_memory: u32,
    /// Address of the kernel's (mangled) name inside the traced process; read it there with
    /// [`Kernel::name`].
    pub name_ptr: u64,
    /// CUDA graph node that launched it (0 outside graphs).
    pub graph_node_id: u64,
    /// CUDA graph id (0 outside graphs).
    pub graph_id: u32,
}

impl Kernel {
    /// The kernel's name.
    ///
    /// # Safety
    /// Only inside the process whose CUPTI produced the record, while CUPTI keeps the string
    /// (until the record's buffer is returned).
    pub unsafe fn name(&self) -> Option<&std::ffi::CStr> {
        (self.name_ptr != 0).then(|| std::ffi::CStr::from_ptr(self.name_ptr as *const _))
    }
}

/// A memory copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memcpy {
    /// `CUpti_ActivityMemcpyKind` (see [`crate::memcpy_kind_name`]).
    pub copy_kind: u8,
    /// Source memory kind.
    pub src_kind: u8,
    /// Destination memory kind.
    pub dst_kind: u8,
    /// Bytes copied.
    pub bytes: u64,
    /// Start (CUPTI clock, ns).
    pub start: u64,
    /// End.
    pub end: u64,
    /// Device index.
    pub device_id: u32,
    /// Context id.
    pub context_id: u32,
    /// Stream id.
    pub stream_id: u32,
    /// Joins the copy with its API call.
    pub correlation_id: u32,
}

/// A memset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memset {
    /// Value written.
    pub value: u32,
    /// Bytes set.
    pub bytes: u64,
    /// Start (CUPTI clock, ns).
    pub start: u64,
    /// End.
    pub end: u64,
    /// Device index.
    pub device_id: u32,
    /// Context id.
    pub context_id: u32,
    /// Stream id.
    pub stream_id: u32,
    /// Joins the memset with its API call.
    pub correlation_id: u32,
    /// Memory kind.
    pub memory_kind: u16,
}

/// Which API a call record belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApiDomain {
    /// CUDA driver API (`cu*`).
    #[default]
    Driver,
    /// CUDA runtime API (`cuda*`).
    Runtime,
}

/// A driver or runtime API call on a CPU thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Api {
    /// Driver or runtime.
    pub domain: ApiDomain,
    /// Callback id of the function (`CUpti_driver_api_trace_cbid` / `…runtime…`).
    pub cbid: u32,
    /// Start (CUPTI clock, ns).
    pub start: u64,
    /// End.
    pub end: u64,
    /// Calling process.
    pub process_id: u32,
    /// Calling thread (the OS tid on Linux).
    pub thread_id: u32,
    /// Joins the call with the GPU work it started.
    pub correlation_id: u32,
    /// The call's return code.
    pub return_value: u32,
}

/// A host-side synchronization (event, stream or context synchronize, stream wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Synchronization {
    /// `CUpti_ActivitySynchronizationType` (see [`crate::synchronization_name`]).
    pub sync_type: u32,
    /// Start (CUPTI clock, ns).
    pub start: u64,
    /// End.
    pub end: u64,
    /// Joins it with its API call.
    pub correlation_id: u32,
    /// Context id.
    pub context_id: u32,
    /// Stream id (u32::MAX when not a stream operation).
    pub stream_id: u32,
    /// CUDA event id (u32::MAX when no event).
    pub cuda_event_id: u32,
}

/// Ties a CUPTI correlation id to an external id (pushed by the application or by us).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ExternalCorrelation {
    /// `CUpti_ExternalCorrelationKind`.
    pub external_kind: u32,
    /// The external id.
    pub external_id: u64,
    /// The CUPTI correlation id.
    pub correlation_id: u32,
}

/// One decoded activity record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// `KERNEL` or `CONCURRENT_KERNEL`.
    Kernel(Kernel),
    /// `MEMCPY`.
    Memcpy(Memcpy),
    /// `MEMSET`.
    Memset(Memset),
    /// `DRIVER` or `RUNTIME`.
    Api(Api),
    /// `SYNCHRONIZATION`.
    Synchronization(Synchronization),
    /// `EXTERNAL_CORRELATION`.
    ExternalCorrelation(ExternalCorrelation),
    /// A kind this crate does not decode.
    Other(u32),
}

/// Bytes [`decode`] reads from a record of `kind` (0 for kinds it does not decode beyond the
/// kind itself).
pub fn min_len(kind: u32) -> usize {
    match kind {
        kind::KERNEL | kind::CONCURRENT_KERNEL => offset::kernel::LEN,
        kind::MEMCPY => offset::memcpy::LEN,
        kind::MEMSET => offset::memset::LEN,
        kind::DRIVER | kind::RUNTIME => offset::api::LEN,
        kind::SYNCHRONIZATION => offset::synchronization::LEN,
        kind::EXTERNAL_CORRELATION => offset::external_correlation::LEN,
        _ => 4,
    }
}

/// A record shorter than its kind's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Truncated {
    /// The record's kind.
    pub kind: u32,
    /// Bytes given.
    pub len: usize,
}

impl std::fmt::Display for Truncated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CUPTI record of kind {} is {} bytes, {} needed",
            self.kind,
            self.len,
            min_len(self.kind)
        )
    }
}

impl std::error::Error for Truncated {}

fn u8_at(b: &[u8], o: usize) -> u8 {
    b[o]
}
fn u16_at(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn i32_at(b: &[u8], o: usize) -> i32 {
    u32_at(b, o) as i32
}
fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"))
}

/// Decodes the record that starts at `b[0]`; `b` must hold at least [`min_len`] bytes of it.
pub fn decode(b: &[u8]) -> Result<Activity, Truncated> {
    if b.len() < 4 {
        return Err(Truncated {
            kind: 0,
            len: b.len(),
        });
    }
    let k = u32_at(b, 0);
    if b.len() < min_len(k) {
        return Err(Truncated {
            kind: k,
            len: b.len(),
        });
    }
    Ok(match k {
        kind::KERNEL | kind::CONCURRENT_KERNEL => {
            use offset::kernel as o;
            let dim = |at: usize| [i32_at(b, at), i32_at(b, at + 4), i32_at(b, at + 8)];
            Activity::Kernel(Kernel {
                start: u64_at(b, o::START),
                end: u64_at(b, o::END),
                device_id: u32_at(b, o::DEVICE_ID),
                context_id: u32_at(b, o::CONTEXT_ID),
                stream_id: u32_at(b, o::STREAM_ID),
                correlation_id: u32_at(b, o::CORRELATION_ID),
                grid: dim(o::GRID_X),
                block: dim(o::BLOCK_X),
                registers_per_thread: u16_at(b, o::REGISTERS_PER_THREAD),
                static_shared_memory: i32_at(b, o::STATIC_SHARED_MEMORY),
                dynamic_shared_memory: u32_at(b, o::DYNAMIC_SHARED_MEMORY),
                name_ptr: u64_at(b, o::NAME),
                graph_node_id: u64_at(b, o::GRAPH_NODE_ID),
                graph_id: u32_at(b, o::GRAPH_ID),
            })
        }
        kind::MEMCPY => {
            use offset::memcpy as o;
            Activity::Memcpy(Memcpy {
                copy_kind: u8_at(b, o::COPY_KIND),
                src_kind: u8_at(b, o::SRC_KIND),
                dst_kind: u8_at(b, o::DST_KIND),
                bytes: u64_at(b, o::BYTES),
                start: u64_at(b, o::START),
                end: u64_at(b, o::END),
                device_id: u32_at(b, o::DEVICE_ID),
                context_id: u32_at(b, o::CONTEXT_ID),
                stream_id: u32_at(b, o::STREAM_ID),
                correlation_id: u32_at(b, o::CORRELATION_ID),
            })
        }
        kind::MEMSET => {
            use offset::memset as o;
            Activity::Memset(Memset {
                value: u32_at(b, o::VALUE),
                bytes: u64_at(b, o::BYTES),
                start: u64_at(b, o::START),
                end: u64_at(b, o::END),
                device_id: u32_at(b, o::DEVICE_ID),
                context_id: u32_at(b, o::CONTEXT_ID),
                stream_id: u32_at(b, o::STREAM_ID),
                correlation_id: u32_at(b, o::CORRELATION_ID),
                memory_kind: u16_at(b, o::MEMORY_KIND),
            })
        }
        kind::DRIVER | kind::RUNTIME => {
            use offset::api as o;
            Activity::Api(Api {
                domain: if k == kind::DRIVER {
                    ApiDomain::Driver
                } else {
                    ApiDomain::Runtime
                },
                cbid: u32_at(b, o::CBID),
                start: u64_at(b, o::START),
                end: u64_at(b, o::END),
                process_id: u32_at(b, o::PROCESS_ID),
                thread_id: u32_at(b, o::THREAD_ID),
                correlation_id: u32_at(b, o::CORRELATION_ID),
                return_value: u32_at(b, o::RETURN_VALUE),
            })
        }
        kind::SYNCHRONIZATION => {
            use offset::synchronization as o;
            Activity::Synchronization(Synchronization {
                sync_type: u32_at(b, o::TYPE),
                start: u64_at(b, o::START),
                end: u64_at(b, o::END),
                correlation_id: u32_at(b, o::CORRELATION_ID),
                context_id: u32_at(b, o::CONTEXT_ID),
                stream_id: u32_at(b, o::STREAM_ID),
                cuda_event_id: u32_at(b, o::CUDA_EVENT_ID),
            })
        }
        kind::EXTERNAL_CORRELATION => {
            use offset::external_correlation as o;
            Activity::ExternalCorrelation(ExternalCorrelation {
                external_kind: u32_at(b, o::EXTERNAL_KIND),
                external_id: u64_at(b, o::EXTERNAL_ID),
                correlation_id: u32_at(b, o::CORRELATION_ID),
            })
        }
        other => Activity::Other(other),
    })
}

/// Writes records in CUPTI's layout: what a stand-in libcupti hands to the buffer-completed
/// callback, and what tests decode.
pub mod encode {
    use super::*;

    fn put(b: &mut [u8], o: usize, v: &[u8]) {
        b[o..o + v.len()].copy_from_slice(v);
    }

    /// Record sizes as CUPTI 13 lays them out (Kernel13, Memcpy7, Memset5, API,
    /// Synchronization2, ExternalCorrelation), 8-byte aligned.
    pub fn record_len(kind: u32) -> usize {
        match kind {
            kind::KERNEL | kind::CONCURRENT_KERNEL => 248,
            kind::MEMCPY => 112,
            kind::MEMSET => 104,
            kind::DRIVER | kind::RUNTIME => 40,
            kind::SYNCHRONIZATION => 56,
            kind::EXTERNAL_CORRELATION => 24,
            _ => 8,
        }
    }

    /// Appends `a` to `out` as a CUPTI record (zeros in the fields not modelled here); kernels
    /// are written as `CONCURRENT_KERNEL`, what the agent enables.
    pub fn push(out: &mut Vec<u8>, a: &Activity) {
        let k = match a {
            Activity::Kernel(_) => kind::CONCURRENT_KERNEL,
            Activity::Memcpy(_) => kind::MEMCPY,
            Activity::Memset(_) => kind::MEMSET,
            Activity::Api(x) if x.domain == ApiDomain::Driver => kind::DRIVER,
            Activity::Api(_) => kind::RUNTIME,
            Activity::Synchronization(_) => kind::SYNCHRONIZATION,
            Activity::ExternalCorrelation(_) => kind::EXTERNAL_CORRELATION,
            Activity::Other(k) => *k,
        };
        let len = record_len(k);
        let at = out.len();
        out.resize(at + len, 0);
        let b = &mut out[at..];
        put(b, 0, &k.to_le_bytes());
        match a {
            Activity::Kernel(x) => {
                use offset::kernel as o;
                put(
                    b,
                    o::REGISTERS_PER_THREAD,
                    &x.registers_per_thread.to_le_bytes(),
                );
                put(b, o::START, &x.start.to_le_bytes());
                put(b, o::END, &x.end.to_le_bytes());
                put(b, o::DEVICE_ID, &x.device_id.to_le_bytes());
                put(b, o::CONTEXT_ID, &x.context_id.to_le_bytes());
                put(b, o::STREAM_ID, &x.stream_id.to_le_bytes());
                for i in 0..3 {
                    put(b, o::GRID_X + 4 * i, &x.grid[i].to_le_bytes());
                    put(b, o::BLOCK_X + 4 * i, &x.block[i].to_le_bytes());
                }
                put(
                    b,
                    o::STATIC_SHARED_MEMORY,
                    &x.static_shared_memory.to_le_bytes(),
                );
                put(
                    b,
                    o::DYNAMIC_SHARED_MEMORY,
                    &x.dynamic_shared_memory.to_le_bytes(),
                );
                put(b, o::CORRELATION_ID, &x.correlation_id.to_le_bytes());
                put(b, o::NAME, &x.name_ptr.to_le_bytes());
                put(b, o::GRAPH_NODE_ID, &x.graph_node_id.to_le_bytes());
                put(b, o::GRAPH_ID, &x.graph_id.to_le_bytes());
            }
            Activity::Memcpy(x) => {
                use offset::memcpy as o;
                b[o::COPY_KIND] = x.copy_kind;
                b[o::SRC_KIND] = x.src_kind;
                b[o::DST_KIND] = x.dst_kind;
                put(b, o::BYTES, &x.bytes.to_le_bytes());
                put(b, o::START, &x.start.to_le_bytes());
                put(b, o::END, &x.end.to_le_bytes());
                put(b, o::DEVICE_ID, &x.device_id.to_le_bytes());
                put(b, o::CONTEXT_ID, &x.context_id.to_le_bytes());
                put(b, o::STREAM_ID, &x.stream_id.to_le_bytes());
                put(b, o::CORRELATION_ID, &x.correlation_id.to_le_bytes());
            }
            Activity::Memset(x) => {
                use offset::memset as o;
                put(b, o::VALUE, &x.value.to_le_bytes());
                put(b, o::BYTES, &x.bytes.to_le_bytes());
                put(b, o::START, &x.start.to_le_bytes());
                put(b, o::END, &x.end.to_le_bytes());
                put(b, o::DEVICE_ID, &x.device_id.to_le_bytes());
                put(b, o::CONTEXT_ID, &x.context_id.to_le_bytes());
                put(b, o::STREAM_ID, &x.stream_id.to_le_bytes());
                put(b, o::CORRELATION_ID, &x.correlation_id.to_le_bytes());
                put(b, o::MEMORY_KIND, &x.memory_kind.to_le_bytes());
            }
            Activity::Api(x) => {
                use offset::api as o;
                put(b, o::CBID, &x.cbid.to_le_bytes());
                put(b, o::START, &x.start.to_le_bytes());
                put(b, o::END, &x.end.to_le_bytes());
                put(b, o::PROCESS_ID, &x.process_id.to_le_bytes());
                put(b, o::THREAD_ID, &x.thread_id.to_le_bytes());
                put(b, o::CORRELATION_ID, &x.correlation_id.to_le_bytes());
                put(b, o::RETURN_VALUE, &x.return_value.to_le_bytes());
            }
            Activity::Synchronization(x) => {
                use offset::synchronization as o;
                put(b, o::TYPE, &x.sync_type.to_le_bytes());
                put(b, o::START, &x.start.to_le_bytes());
                put(b, o::END, &x.end.to_le_bytes());
                put(b, o::CORRELATION_ID, &x.correlation_id.to_le_bytes());
                put(b, o::CONTEXT_ID, &x.context_id.to_le_bytes());
                put(b, o::STREAM_ID, &x.stream_id.to_le_bytes());
                put(b, o::CUDA_EVENT_ID, &x.cuda_event_id.to_le_bytes());
            }
            Activity::ExternalCorrelation(x) => {
                use offset::external_correlation as o;
                put(b, o::EXTERNAL_KIND, &x.external_kind.to_le_bytes());
                put(b, o::EXTERNAL_ID, &x.external_id.to_le_bytes());
                put(b, o::CORRELATION_ID, &x.correlation_id.to_le_bytes());
            }
            Activity::Other(_) => {}
        }
    }
}

/// Iterates over the records of a CUPTI 13-layout buffer written by [`encode::push`] (the
/// agent itself walks real buffers with `cuptiActivityGetNextRecord`, which knows each size).
pub fn walk(mut buf: &[u8]) -> impl Iterator<Item = Result<Activity, Truncated>> + '_ {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = encode::record_len(u32_at(buf, 0)).min(buf.len());
        let (rec, rest) = buf.split_at(len);
        buf = rest;
        Some(decode(rec))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Activity> {
        vec![
            Activity::Kernel(Kernel {
                start: 1_000,
                end: 5_000,
                device_id: 1,
                context_id: 2,
                stream_id: 7,
                correlation_id: 42,
                grid: [128, 2, 1],
                block: [256, 1, 1],
                registers_per_thread: 64,
                static_shared_memory: 1024,
                dynamic_shared_memory: 49152,
                name_ptr: 0xdead_beef_0000,
                graph_node_id: 9,
                graph_id: 3,
            }),
            Activity::Memcpy(Memcpy {
                copy_kind: 1,
                src_kind: 2,
                dst_kind: 3,
                bytes: 1 << 30,
                start: 10,
                end: 20,
                device_id: 0,
                context_id: 1,
                stream_id: 13,
                correlation_id: 43,
            }),
            Activity::Memset(Memset {
                value: 0xff,
                bytes: 4096,
                start: 30,
                end: 31,
                device_id: 0,
                context_id: 1,
                stream_id: 7,
                correlation_id: 44,
                memory_kind: 3,
            }),
            Activity::Api(Api {
                domain: ApiDomain::Runtime,
                cbid: 211,
                start: 900,
                end: 950,
                process_id: 1234,
                thread_id: 1240,
                correlation_id: 42,
                return_value: 0,
            }),
            Activity::Api(Api {
                domain: ApiDomain::Driver,
                cbid: 307,
                start: 905,
                end: 945,
                process_id: 1234,
                thread_id: 1240,
                correlation_id: 42,
                return_value: 0,
            }),
            Activity::Synchronization(Synchronization {
                sync_type: 3,
                start: 6_000,
                end: 7_000,
                correlation_id: 45,
                context_id: 1,
                stream_id: 7,
                cuda_event_id: u32::MAX,
            }),
            Activity::ExternalCorrelation(ExternalCorrelation {
                external_kind: 3,
                external_id: 0x1122_3344_5566,
                correlation_id: 42,
            }),
            Activity::Other(47),
        ]
    }

    #[test]
    fn every_record_round_trips_through_cupti_layout() {
        let mut buf = Vec::new();
        for a in samples() {
            encode::push(&mut buf, &a);
        }
        let back: Vec<Activity> = walk(&buf).map(Result::unwrap).collect();
        assert_eq!(back, samples());
    }

    #[test]
    fn fields_sit_at_their_documented_offsets() {
        let mut buf = Vec::new();
        encode::push(&mut buf, &samples()[0]);
        assert_eq!(buf.len(), 248);
        assert_eq!(u32_at(&buf, 0), kind::CONCURRENT_KERNEL);
        assert_eq!(u64_at(&buf, 16), 1_000);
        assert_eq!(u32_at(&buf, 48), 7);
        assert_eq!(u32_at(&buf, 92), 42);
        assert_eq!(u64_at(&buf, 104), 0xdead_beef_0000);
        // A serialised-kernel record decodes the same way.
        buf[0..4].copy_from_slice(&kind::KERNEL.to_le_bytes());
        assert_eq!(decode(&buf), Ok(samples()[0]));
    }

    #[test]
    fn short_records_are_refused_not_read_past() {
        let mut buf = Vec::new();
        encode::push(&mut buf, &samples()[1]);
        let e = decode(&buf[..47]).unwrap_err();
        assert_eq!(e, Truncated { kind: 1, len: 47 });
        assert_eq!(
            e.to_string(),
            "CUPTI record of kind 1 is 47 bytes, 48 needed"
        );
        assert!(decode(&buf[..48]).is_ok());
        assert!(decode(&[1, 0]).is_err());
    }

    #[test]
    fn kernel_names_are_read_in_process() {
        let name = c"ampere_sgemm_128x64_tn";
        let k = Kernel {
            name_ptr: name.as_ptr() as u64,
            ..Kernel::default()
        };
        // SAFETY: the pointer is to a live C string of this process.
        assert_eq!(unsafe { k.name() }, Some(name));
        // SAFETY: null is handled without a read.
        assert_eq!(unsafe { Kernel::default().name() }, None);
    }
}
