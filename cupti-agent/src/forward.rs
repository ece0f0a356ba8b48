//! CUPTI's buffer callbacks, and the forwarding of each record into the channel.
//!
//! The callbacks have no user data, so what they need lives in one global, installed while
//! tracing and removed (under the write lock, so no callback is still using the mapping)
//! before the agent lets go of the channel.

use std::{collections::HashMap, panic::catch_unwind, sync::Mutex, sync::RwLock};

use cupti_sys::{
    channel::{Channel, Event},
    record::{self, Activity, Api, ApiDomain},
    subscription::RecordReader,
    QUIET_DRIVER_API, QUIET_RUNTIME_API,
};

/// Bytes of each buffer handed to CUPTI.
const BUFFER_BYTES: usize = 4 << 20;
/// CUPTI requires 8-byte aligned buffers.
const BUFFER_ALIGN: usize = 8;

struct State {
    reader: RecordReader,
    channel: Channel,
    /// Kernel names already sent, by content.
    names: Mutex<SentNames>,
}

static STATE: RwLock<Option<State>> = RwLock::new(None);

/// Kernel names sent through a channel, by content: one agent run's ids, kept across its
/// traced stretches (the daemon keeps the names it was sent).
pub type SentNames = HashMap<Vec<u8>, u32>;

/// Makes the callbacks forward the records `reader` walks into the channel mapped at
/// `channel`; `names` were sent before.
pub fn install(reader: RecordReader, channel: &Channel, names: SentNames) {
    let state = State {
        reader,
        // SAFETY: `uninstall` runs before the agent unmaps the channel.
        channel: unsafe { channel.alias() },
        names: Mutex::new(names),
    };
    *STATE.write().unwrap_or_else(|p| p.into_inner()) = Some(state);
}

/// Stops forwarding; returns once no callback is inside the channel, with the names sent.
pub fn uninstall() -> SentNames {
    STATE
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .map(|s| s.names.into_inner().unwrap_or_else(|p| p.into_inner()))
        .unwrap_or_default()
}

/// Pushes one event (the agent's own clock samples).
pub fn push(e: &Event) {
    if let Some(s) = STATE.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
        let _names = s.names.lock().unwrap_or_else(|p| p.into_inner());
        s.channel.push(e);
    }
}

fn layout() -> std::alloc::Layout {
    std::alloc::Layout::from_size_align(BUFFER_BYTES, BUFFER_ALIGN).expect("a valid layout")
}

/// `CUpti_BuffersCallbackRequestFunc`: hands CUPTI an empty buffer.
pub unsafe extern "C" fn buffer_requested(buffer: *mut *mut u8, size: *mut usize, max: *mut usize) {
    let _ = catch_unwind(|| {
        // SAFETY: a non-zero-sized layout.
        let p = unsafe { std::alloc::alloc(layout()) };
        // SAFETY: CUPTI passes valid out-pointers.
        unsafe {
            *buffer = p;
            *size = if p.is_null() { 0 } else { BUFFER_BYTES };
            *max = 0;
        }
    });
}

/// `CUpti_BuffersCallbackRequestFunc_v2`: the same for a per-subscriber registration.
pub unsafe extern "C" fn buffer_requested_v2(
    buffer: *mut *mut u8,
    size: *mut usize,
    max: *mut usize,
    _info: *mut libc::c_void,
) {
    buffer_requested(buffer, size, max);
}

/// `CUpti_BuffersCallbackCompleteFunc`: forwards a buffer's records and frees it.
pub unsafe extern "C" fn buffer_completed(
    _context: *mut libc::c_void,
    _stream_id: u32,
    buffer: *mut u8,
    size: usize,
    valid: usize,
) {
    let _ = catch_unwind(|| {
        if let Some(s) = STATE.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            s.forward(buffer, valid);
            let n = s.reader.dropped();
            if n > 0 {
                s.channel.add_cupti_dropped(n as u64);
            }
        }
    });
    if !buffer.is_null() && size == BUFFER_BYTES {
        // SAFETY: every buffer we hand out has this layout; CUPTI returns each once.
        unsafe { std::alloc::dealloc(buffer, layout()) };
    }
}

/// `CUpti_BuffersCallbackCompleteFunc_v2`: the same for a per-subscriber registration.
pub unsafe extern "C" fn buffer_completed_v2(
    buffer: *mut u8,
    size: usize,
    valid: usize,
    _info: *mut libc::c_void,
) {
    buffer_completed(std::ptr::null_mut(), 0, buffer, size, valid);
}

impl State {
    fn forward(&self, buffer: *mut u8, valid: usize) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let mut rec: *mut u8 = std::ptr::null_mut();
        loop {
            // SAFETY: a buffer CUPTI completed for this subscription.
            if !unsafe { self.reader.next(buffer, valid, &mut rec) } {
                break;
            }
            // SAFETY: a record is at least as long as its kind's fields (CUPTI 12.9+ layouts).
            let k = unsafe { (rec as *const u32).read_unaligned() };
            let bytes = unsafe { std::slice::from_raw_parts(rec, record::min_len(k)) };
            let Ok(activity) = record::decode(bytes) else {
                continue;
            };
            let event = match activity {
                Activity::Kernel(k) => {
                    // SAFETY: the record was produced in this process and its buffer is live.
                    let name = unsafe { k.name() }.map_or(&b"kernel"[..], |n| n.to_bytes());
                    let next = names.len() as u32 + 1;
                    let id = match names.get(name) {
                        Some(id) => *id,
                        None => {
                            for chunk in Event::name_chunks(next, name) {
                                self.channel.push(&chunk);
                            }
                            names.insert(name.to_vec(), next);
                            next
                        }
                    };
                    let volume =
                        |d: [i32; 3]| d.iter().map(|x| (*x).max(1) as u64).product::<u64>();
                    Event::Kernel {
                        start: k.start,
                        end: k.end,
                        device_id: k.device_id,
                        stream_id: k.stream_id,
                        correlation_id: k.correlation_id,
                        name_id: id,
                        threads: volume(k.grid) * volume(k.block),
                        graph_id: k.graph_id,
                    }
                }
                Activity::Memcpy(m) => Event::Memcpy(m),
                Activity::Memset(m) => Event::Memset(m),
                Activity::Api(a) if quieted(&a) => continue,
                Activity::Api(a) => Event::Api(a),
                Activity::Synchronization(s) => Event::Synchronization(s),
                Activity::ExternalCorrelation(x) => Event::ExternalCorrelation {
                    external_kind: x.external_kind,
                    external_id: x.external_id,
                    correlation_id: x.correlation_id,
                },
                Activity::Other(_) => continue,
            };
            self.channel.push(&event);
        }
    }
}

/// Whether `a` is a call the subscription quiets (`Subscription::quiet`). Quieting comes after
/// the API kinds are enabled, since enabling a kind turns each of its functions on, so CUPTI
/// records the calls made in between; they are dropped here.
fn quieted(a: &Api) -> bool {
    let table: &[(u32, &str)] = match a.domain {
        ApiDomain::Driver => &QUIET_DRIVER_API,
        ApiDomain::Runtime => &QUIET_RUNTIME_API,
    };
    table.iter().any(|(cbid, _)| *cbid == a.cbid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quieted_calls_are_dropped_and_no_other() {
        let cases = [
            (ApiDomain::Runtime, QUIET_RUNTIME_API[0].0, true),
            (ApiDomain::Driver, QUIET_DRIVER_API[0].0, true),
            // cudaLaunchKernel (runtime 211) and cuLaunchKernel (driver 307) are kept.
            (ApiDomain::Runtime, 211, false),
            (ApiDomain::Driver, 307, false),
        ];
        for (domain, cbid, dropped) in cases {
            let a = Api {
                domain,
                cbid,
                ..Api::default()
            };
            assert_eq!(quieted(&a), dropped, "{domain:?} {cbid}");
        }
    }
}
