//! Taking CUPTI's subscriber slot without fighting anyone for it.
//!
//! CUPTI >= 13.3 can share the slot: `cuptiSubscribe_v2` asks for a subscriber that allows
//! others, and every activity call then takes the subscriber's handle (`*_v2`). Older CUPTI,
//! or one whose driver cannot share, has one slot (`cuptiSubscribe`). [`subscribe`] asks for
//! a shared slot first, then a slot of its own through the same API when sharing is not
//! possible here, then the classic call; a slot held by a tool that does not share is
//! reported with that tool's name where CUPTI gives it ([`SubscribeError::Held`]), and left
//! alone. [`Subscription`] sends each activity call to the API it subscribed with.

use std::ffi::{c_char, c_void, CStr};

use crate::{
    library::{
        BufferCompletedFunc, BufferCompletedFuncV2, BufferRequestedFunc, BufferRequestedFuncV2,
        CallbackFunc, Cupti, SubscriberHandle,
    },
    result::{self, CuptiError, CuptiResult, MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, SUCCESS},
};

/// `CUPTI_ACTIVITY_ATTR_THREAD_ID_TYPE`.
pub const ATTR_THREAD_ID_TYPE: u32 = 21;
/// `CUPTI_ACTIVITY_THREAD_ID_TYPE_SYSTEM`: gettid() on Linux.
pub const THREAD_ID_TYPE_SYSTEM: u32 = 1;

/// `CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN`: room for the name of the tool holding the slot.
pub const OLD_SUBSCRIBER_NAME_MIN_LEN: usize = 64;

/// `CUpti_SubscriberParams` (cupti_callbacks.h, CUPTI >= 13.3); its layout is checked against
/// the header by `tests/layout.rs`.
#[repr(C)]
#[derive(Debug)]
pub struct SubscriberParams {
    /// `structSize`: bytes of this struct.
    pub struct_size: usize,
    /// `subscriberName`: ours (CUPTI shows it as "CUPTI for <name>").
    pub subscriber_name: *const c_char,
    /// `oldSubscriberName`: where CUPTI writes the name of a holder that does not share.
    pub old_subscriber_name: *mut c_char,
    /// `oldSubscriberSize`: bytes at `old_subscriber_name`.
    pub old_subscriber_size: usize,
    /// `allowMultipleSubscribers`: 1 to share the slot.
    pub allow_multiple_subscribers: u8,
    /// `padding`.
    pub padding: [u8; 7],
}

/// How the subscription was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `cuptiSubscribe_v2` allowing other subscribers (CUPTI >= 13.3 with a driver that can).
    Shared,
    /// `cuptiSubscribe_v2` alone: this CUPTI or driver cannot share, and nobody else holds it.
    Exclusive,
    /// `cuptiSubscribe`: a CUPTI without the per-subscriber API.
    Classic,
}

impl Mode {
    /// The number the agent writes into the channel (0 is "not subscribed").
    pub fn code(self) -> u32 {
        match self {
            Mode::Shared => 1,
            Mode::Exclusive => 2,
            Mode::Classic => 3,
        }
    }

    /// The mode of a channel code.
    pub fn from_code(c: u32) -> Option<Mode> {
        match c {
            1 => Some(Mode::Shared),
            2 => Some(Mode::Exclusive),
            3 => Some(Mode::Classic),
            _ => None,
        }
    }

    /// Its name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Shared => "shared (multi-subscriber)",
            Mode::Exclusive => "exclusive (per-subscriber API, sharing not available)",
            Mode::Classic => "classic (single subscriber)",
        }
    }
}

/// Why no subscription was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubscribeError {
    /// Another tool holds the slot and does not share it.
    Held {
        /// The call that said so.
        call: &'static str,
        /// The holder's name, when CUPTI gave it.
        holder: Option<String>,
    },
    /// Any other failure.
    Failed(CuptiError),
}

impl std::fmt::Display for SubscribeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SubscribeError::Held { call, holder } => {
                write!(
                    f,
                    "{call} failed: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ({MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED}): "
                )?;
                match holder {
                    Some(h) => write!(f, "\"{h}\" holds CUPTI's subscriber slot and does not share it")?,
                    None => write!(
                        f,
                        "another CUPTI client, e.g. torch.profiler or Nsight, holds the subscriber slot"
                    )?,
                }
                write!(
                    f,
                    "; stallscope leaves it alone: attach again once that tool has finished"
                )
            }
            SubscribeError::Failed(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for SubscribeError {}

/// A subscriber handle, as a number so that it can be shared with the buffer callbacks.
#[derive(Debug, Clone, Copy)]
struct Handle(usize);

impl Handle {
    fn ptr(self) -> SubscriberHandle {
        self.0 as SubscriberHandle
    }
}

/// A subscription held by us.
pub struct Subscription<'a> {
    cupti: &'a Cupti,
    handle: Handle,
    mode: Mode,
}

/// The name CUPTI wrote into `buf`, if any.
fn holder_name(buf: &[c_char]) -> Option<String> {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let s = String::from_utf8_lossy(&bytes).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Subscribes as `name` with `callback` (which receives no user data): shared when CUPTI can
/// share, else alone.
pub fn subscribe<'a>(
    cupti: &'a Cupti,
    callback: CallbackFunc,
    name: &CStr,
) -> Result<Subscription<'a>, SubscribeError> {
    let mut handle: SubscriberHandle = std::ptr::null_mut();
    if let Some(v2) = &cupti.v2 {
        for mode in [Mode::Shared, Mode::Exclusive] {
            let mut old = [0 as c_char; OLD_SUBSCRIBER_NAME_MIN_LEN];
            let mut params = SubscriberParams {
                struct_size: std::mem::size_of::<SubscriberParams>(),
                subscriber_name: name.as_ptr(),
                old_subscriber_name: old.as_mut_ptr(),
                old_subscriber_size: old.len(),
                allow_multiple_subscribers: u8::from(mode == Mode::Shared),
                padding: [0; 7],
            };
            // SAFETY: documented signature; every pointer outlives the call.
            let r =
                unsafe { (v2.subscribe)(&mut handle, callback, std::ptr::null_mut(), &mut params) };
            match (r, holder_name(&old)) {
                (SUCCESS, _) => {
                    return Ok(Subscription {
                        cupti,
                        handle: Handle(handle as usize),
                        mode,
                    })
                }
                // Nobody named: this CUPTI or driver cannot share; ask for the slot alone.
                (MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, None) if mode == Mode::Shared => continue,
                (MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED, holder) => {
                    return Err(SubscribeError::Held {
                        call: "cuptiSubscribe_v2",
                        holder,
                    })
                }
                (code, _) => {
                    return Err(SubscribeError::Failed(CuptiError {
                        call: "cuptiSubscribe_v2",
                        code,
                    }))
                }
            }
        }
    }
    // SAFETY: documented signature; `handle` outlives the call.
    match unsafe { (cupti.subscribe)(&mut handle, callback, std::ptr::null_mut()) } {
        SUCCESS => Ok(Subscription {
            cupti,
            handle: Handle(handle as usize),
            mode: Mode::Classic,
        }),
        MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => Err(SubscribeError::Held {
            call: "cuptiSubscribe",
            holder: None,
        }),
        code => Err(SubscribeError::Failed(CuptiError {
            call: "cuptiSubscribe",
            code,
        })),
    }
}

impl Subscription<'_> {
    /// How it was made.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn per_subscriber(&self) -> Option<&crate::library::CuptiV2> {
        self.cupti
            .v2
            .as_ref()
            .filter(|_| self.mode != Mode::Classic)
    }

    /// Registers the buffer callbacks of the API subscribed with.
    pub fn register_callbacks(
        &self,
        classic: (BufferRequestedFunc, BufferCompletedFunc),
        v2: (BufferRequestedFuncV2, BufferCompletedFuncV2),
    ) -> Result<(), CuptiError> {
        // SAFETY: documented signatures; the callbacks are the caller's.
        match self.per_subscriber() {
            Some(api) => result::check("cuptiActivityRegisterCallbacks_v2", unsafe {
                (api.activity_register_callbacks)(self.handle.ptr(), v2.0, v2.1)
            }),
            None => result::check("cuptiActivityRegisterCallbacks", unsafe {
                (self.cupti.activity_register_callbacks)(classic.0, classic.1)
            }),
        }
    }

    /// Enables records of `kind` for this subscriber.
    pub fn enable(&self, kind: u32) -> Result<(), CuptiError> {
        // SAFETY: documented signatures; no activity config (NULL is allowed).
        match self.per_subscriber() {
            Some(api) => result::check("cuptiActivityEnable_v2", unsafe {
                (api.activity_enable)(self.handle.ptr(), kind, std::ptr::null_mut())
            }),
            None => result::check("cuptiActivityEnable", unsafe {
                (self.cupti.activity_enable)(kind)
            }),
        }
    }

    /// Disables records of `kind` for this subscriber.
    pub fn disable(&self, kind: u32) -> CuptiResult {
        // SAFETY: as for `enable`.
        match self.per_subscriber() {
            Some(api) => unsafe {
                (api.activity_disable)(self.handle.ptr(), kind, std::ptr::null_mut())
            },
            None => unsafe { (self.cupti.activity_disable)(kind) },
        }
    }

    /// Asks for the kernel's thread ids (gettid) in API records. CUPTI's default on Linux is
    /// `pthread_self()` cut to 32 bits, which names no thread in /proc (seen on CUPTI 13.0:
    /// API records of the main thread carried 98029888). Returns the process-wide setting to
    /// put back with [`Self::restore_thread_ids`] (classic mode); a per-subscriber setting ends
    /// with the subscriber. `None`: this CUPTI cannot be asked, ids stay CUPTI's.
    pub fn use_system_thread_ids(&self) -> Option<u32> {
        if let Some(api) = self.per_subscriber() {
            let set = api.activity_set_attribute?;
            let (mut size, mut value) = (std::mem::size_of::<u32>(), THREAD_ID_TYPE_SYSTEM);
            // SAFETY: documented signature; both pointers outlive the call.
            let r = unsafe {
                set(
                    self.handle.ptr(),
                    ATTR_THREAD_ID_TYPE,
                    &mut size,
                    (&mut value as *mut u32).cast(),
                )
            };
            return (r == SUCCESS).then_some(THREAD_ID_TYPE_SYSTEM);
        }
        let (get, set) = (
            self.cupti.get_thread_id_type?,
            self.cupti.set_thread_id_type?,
        );
        let mut previous = 0;
        // SAFETY: documented signatures; `previous` outlives the call.
        unsafe {
            (get(&mut previous) == SUCCESS && set(THREAD_ID_TYPE_SYSTEM) == SUCCESS)
                .then_some(previous)
        }
    }

    /// Puts back the process-wide thread id setting [`Self::use_system_thread_ids`] replaced.
    pub fn restore_thread_ids(&self, previous: u32) {
        if self.per_subscriber().is_none() {
            if let Some(set) = self.cupti.set_thread_id_type {
                // SAFETY: documented signature.
                unsafe { set(previous) };
            }
        }
    }

    /// Turns off the records of the API functions listed (callback ids), runtime and driver,
    /// for this subscriber; how many were turned off. Call it after enabling the API kinds:
    /// enabling a kind turns every one of its functions back on. Disabling the kind at detach
    /// leaves nothing of it behind.
    pub fn quiet(&self, runtime: &[u32], driver: &[u32]) -> usize {
        let mut n = 0;
        // SAFETY (each call): documented signatures, plain values.
        match self.per_subscriber() {
            Some(api) => {
                for (f, ids) in [
                    (api.activity_enable_runtime_api, runtime),
                    (api.activity_enable_driver_api, driver),
                ] {
                    let Some(f) = f else { continue };
                    n += ids
                        .iter()
                        .filter(|&&id| unsafe { f(self.handle.ptr(), id, 0) } == SUCCESS)
                        .count();
                }
            }
            None => {
                for (f, ids) in [
                    (self.cupti.activity_enable_runtime_api, runtime),
                    (self.cupti.activity_enable_driver_api, driver),
                ] {
                    let Some(f) = f else { continue };
                    n += ids
                        .iter()
                        .filter(|&&id| unsafe { f(id, 0) } == SUCCESS)
                        .count();
                }
            }
        }
        n
    }

    /// What the buffer callbacks need to walk this subscriber's buffers.
    pub fn reader(&self) -> RecordReader {
        match self.per_subscriber() {
            Some(api) => RecordReader {
                handle: self.handle,
                next: Next::PerSubscriber(api.activity_get_next_record),
                dropped: api
                    .activity_get_num_dropped_records
                    .map(Dropped::PerSubscriber),
            },
            None => RecordReader {
                handle: self.handle,
                next: Next::Classic(self.cupti.activity_get_next_record),
                dropped: self
                    .cupti
                    .activity_get_num_dropped_records
                    .map(Dropped::Classic),
            },
        }
    }

    /// Gives the slot back. After a shared subscription CUPTI stays set up for the other
    /// subscribers; otherwise it is finalized (nothing of CUPTI keeps pointers into the agent).
    pub fn unsubscribe(self) {
        // SAFETY: documented signatures; the handle is ours.
        unsafe {
            (self.cupti.unsubscribe)(self.handle.ptr());
            if self.mode != Mode::Shared {
                if let Some(finalize) = self.cupti.finalize {
                    finalize();
                }
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Next {
    Classic(unsafe extern "C" fn(*mut u8, usize, *mut *mut u8) -> CuptiResult),
    PerSubscriber(
        unsafe extern "C" fn(SubscriberHandle, *mut u8, usize, *mut *mut u8) -> CuptiResult,
    ),
}

#[derive(Debug, Clone, Copy)]
enum Dropped {
    Classic(unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> CuptiResult),
    PerSubscriber(
        unsafe extern "C" fn(SubscriberHandle, *mut c_void, u32, *mut usize) -> CuptiResult,
    ),
}

/// Walks the activity buffers of one subscription (`cuptiActivityGetNextRecord[_v2]`) and reads
/// its dropped-record count.
#[derive(Debug, Clone, Copy)]
pub struct RecordReader {
    handle: Handle,
    next: Next,
    dropped: Option<Dropped>,
}

impl RecordReader {
    /// The next record of `buffer` after `*record` (the first when it is null); false at the
    /// end of the buffer or on error.
    ///
    /// # Safety
    /// `buffer` holds `valid` bytes of a buffer CUPTI completed for this subscription, and
    /// `*record` is null or a record of it.
    pub unsafe fn next(&self, buffer: *mut u8, valid: usize, record: &mut *mut u8) -> bool {
        let r = match self.next {
            Next::Classic(f) => f(buffer, valid, record),
            Next::PerSubscriber(f) => f(self.handle.ptr(), buffer, valid, record),
        };
        r == SUCCESS && !record.is_null()
    }

    /// Records CUPTI dropped since the last call (0 when it cannot say).
    pub fn dropped(&self) -> usize {
        let mut n = 0usize;
        // SAFETY: documented signatures; `n` outlives the call.
        let r = match self.dropped {
            Some(Dropped::Classic(f)) => unsafe { f(std::ptr::null_mut(), 0, &mut n) },
            Some(Dropped::PerSubscriber(f)) => unsafe {
                f(self.handle.ptr(), std::ptr::null_mut(), 0, &mut n)
            },
            None => return 0,
        };
        if r == SUCCESS {
            n
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriber_params_have_the_header_layout() {
        // The offsets tests/layout.rs checks against cupti_callbacks.h, on this build.
        assert_eq!(std::mem::size_of::<SubscriberParams>(), 40);
        assert_eq!(
            std::mem::offset_of!(SubscriberParams, old_subscriber_size),
            24
        );
        assert_eq!(
            std::mem::offset_of!(SubscriberParams, allow_multiple_subscribers),
            32
        );
    }

    #[test]
    fn a_held_slot_names_its_holder_and_the_way_out() {
        let named = SubscribeError::Held {
            call: "cuptiSubscribe_v2",
            holder: Some("CUPTI for Nsight Systems".into()),
        }
        .to_string();
        assert!(
            named.starts_with("cuptiSubscribe_v2 failed: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39): \"CUPTI for Nsight Systems\" holds"),
            "{named}"
        );
        assert!(named.contains("attach again"), "{named}");
        let unnamed = SubscribeError::Held {
            call: "cuptiSubscribe",
            holder: None,
        }
        .to_string();
        assert!(unnamed.contains("torch.profiler"), "{unnamed}");
    }

    #[test]
    fn the_holder_name_stops_at_the_terminator() {
        let mut buf = [0 as c_char; 8];
        assert_eq!(holder_name(&buf), None);
        for (i, b) in b"Kineto\0x".iter().enumerate() {
            buf[i] = *b as c_char;
        }
        assert_eq!(holder_name(&buf).as_deref(), Some("Kineto"));
    }

    #[test]
    fn modes_survive_the_channel() {
        for m in [Mode::Shared, Mode::Exclusive, Mode::Classic] {
            assert_eq!(Mode::from_code(m.code()), Some(m));
        }
        assert_eq!(Mode::from_code(0), None);
    }
}
