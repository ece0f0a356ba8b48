//! A stand-in for libcupti.so.13 where no GPU can exist (CI): the entry points the agent calls,
//! with CUPTI's semantics as documented (one classic subscriber, or several through
//! `cuptiSubscribe_v2` when each allows the others, with the per-subscriber `*_v2` activity
//! calls; records delivered through the registered buffer callbacks, kernels only once they have finished, everything on a forced
//! flush; `cuptiActivityGetNextRecord` walks CUPTI 13 record sizes; timestamps on
//! CLOCK_REALTIME, CUPTI's default clock on Linux x86-64), and records written in the real
//! layouts by `cupti_sys::record::encode`.
//!
//! Instead of CUDA work, a test target calls the `stallscope_standin_*` hooks (through
//! ctypes): a kernel launch, a copy, a stream synchronize (which really waits for the
//! simulated stream), or holding the subscriber slot as another tool would. The environment
//! variable `STALLSCOPE_STANDIN_CUPTI_VERSION` makes it report an older `CUPTI_API_VERSION`
//! (below 130300 it has no `*_v2` API, as CUPTI 13.0 has none), and
//! `STALLSCOPE_STANDIN_NO_SHARING=1` plays a driver that cannot share CUPTI.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, VecDeque},
    ffi::{c_char, c_void, CStr, CString},
    sync::{Mutex, MutexGuard, OnceLock},
};

use cupti_sys::{
    kind,
    record::{encode, Activity, Api, ApiDomain, Kernel, Memcpy, Synchronization},
    result::{self, CuptiResult},
    FLUSH_FORCED,
};

/// `CUPTI_API_VERSION` of CUPTI 13.5, whose record sizes the stand-in writes.
const API_VERSION: u32 = 130500;
/// The handle of our subscriber (CUPTI's handles are opaque pointers).
static SUBSCRIBER: u8 = 0;
/// `CUPTI_ERROR_API_NOT_IMPLEMENTED`.
const API_NOT_IMPLEMENTED: CuptiResult = 11;
/// `CUPTI_ERROR_INVALID_KIND`.
const INVALID_KIND: CuptiResult = 21;
/// Bytes the stand-in asks its buffers to hold at least.
const MIN_BUFFER: usize = 256;
/// Runtime API callback ids (`CUpti_runtime_api_trace_cbid`).
const CBID_LAUNCH_KERNEL: u32 = 211;
const CBID_MEMCPY_ASYNC: u32 = 41;
const CBID_STREAM_SYNCHRONIZE: u32 = 131;
/// `cudaGetDevice`, which PyTorch calls around every launch (a query: no GPU work).
const CBID_GET_DEVICE: u32 = 17;
/// Simulated launch latency: a kernel starts this long after its launch call returns.
const LAUNCH_LATENCY_NS: u64 = 4_000;

type Request = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
type Complete = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);
type RequestV2 = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize, *mut RequestInfo);
type CompleteV2 = unsafe extern "C" fn(*mut u8, usize, usize, *mut CompleteInfo);

/// `CUpti_BufferCallbackRequestInfo`.
#[repr(C)]
pub struct RequestInfo {
    struct_size: usize,
}

/// `CUpti_BufferCallbackCompleteInfo`.
#[repr(C)]
pub struct CompleteInfo {
    struct_size: usize,
    thread_id: u64,
    record_layouts: *mut c_void,
    num_record_layouts: usize,
}

/// The registered buffer callbacks, of the API the client subscribed with.
#[derive(Clone, Copy)]
enum Callbacks {
    Classic(Request, Complete),
    PerSubscriber(RequestV2, CompleteV2),
}

impl Callbacks {
    /// An empty buffer from the client: (pointer, size).
    fn request(self) -> (*mut u8, usize) {
        let (mut p, mut size, mut max) = (std::ptr::null_mut(), 0usize, 0usize);
        let mut info = RequestInfo {
            struct_size: std::mem::size_of::<RequestInfo>(),
        };
        // SAFETY: the client's documented request callback with valid out-pointers.
        unsafe {
            match self {
                Callbacks::Classic(r, _) => r(&mut p, &mut size, &mut max),
                Callbacks::PerSubscriber(r, _) => r(&mut p, &mut size, &mut max, &mut info),
            }
        }
        (p, size)
    }

    /// Hands a buffer back to the client.
    fn complete(self, p: *mut u8, size: usize, used: usize) {
        let mut info = CompleteInfo {
            struct_size: std::mem::size_of::<CompleteInfo>(),
            // SAFETY: gettid cannot fail.
            thread_id: unsafe { libc::gettid() } as u64,
            record_layouts: std::ptr::null_mut(),
            num_record_layouts: 0,
        };
        // SAFETY: the client's documented completion callback, outside our lock.
        unsafe {
            match self {
                Callbacks::Classic(_, c) => c(std::ptr::null_mut(), 0, p, size, used),
                Callbacks::PerSubscriber(_, c) => c(p, size, used, &mut info),
            }
        }
    }
}

/// How our client holds CUPTI.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum Subscribed {
    #[default]
    No,
    Classic,
    /// Through `cuptiSubscribe_v2`, allowing others (true) or not.
    PerSubscriber(bool),
}

/// Another tool's hold on CUPTI (set by [`stallscope_standin_hold`]).
#[derive(Clone, Default)]
struct Other {
    /// 0 none, 1 a subscriber that does not share, 2 one that does.
    hold: i32,
    name: String,
}

#[derive(Default)]
struct State {
    subscribed: Subscribed,
    other: Other,
    callbacks: Option<Callbacks>,
    enabled: u64,
    buffer: Option<(*mut u8, usize, usize)>,
    /// Records of GPU work not finished yet: (end time, record).
    pending: VecDeque<(u64, Activity)>,
    /// When each stream's queue drains.
    busy_until: BTreeMap<u32, u64>,
    correlation: u32,
    /// `CUpti_ActivityThreadIdType` of API records: 0 pthread_self() cut to 32 bits (CUPTI's
    /// default on Linux), 1 gettid().
    thread_id_type: u32,
    /// Runtime functions whose records are turned off (`cuptiActivityEnableRuntimeApi`).
    quiet: BTreeSet<u32>,
}

// SAFETY: the buffer pointer is owned by whoever holds the lock.
unsafe impl Send for State {}

static STATE: Mutex<State> = Mutex::new(State {
    subscribed: Subscribed::No,
    other: Other {
        hold: 0,
        name: String::new(),
    },
    callbacks: None,
    enabled: 0,
    buffer: None,
    pending: VecDeque::new(),
    busy_until: BTreeMap::new(),
    correlation: 0,
    thread_id_type: 0,
    quiet: BTreeSet::new(),
});

fn state() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|p| p.into_inner())
}

fn realtime_ns() -> u64 {
    sys_util::clock::clock_ns(libc::CLOCK_REALTIME)
}

/// Full buffers to hand back, collected under the lock and delivered after it.
type Completed = Vec<(Callbacks, *mut u8, usize, usize)>;

/// The `CUPTI_API_VERSION` the stand-in plays.
fn api_version() -> u32 {
    std::env::var("STALLSCOPE_STANDIN_CUPTI_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(API_VERSION)
}

/// Whether this CUPTI has the per-subscriber API.
fn has_v2() -> bool {
    api_version() >= cupti_sys::library::MULTI_SUBSCRIBER_SINCE
}

impl State {
    fn on(&self, k: u32) -> bool {
        self.enabled & (1 << k) != 0
    }

    /// Appends `a`'s bytes to the current buffer, completing it (into `done`) when full.
    fn append(&mut self, a: &Activity, done: &mut Completed) {
        let Some(callbacks) = self.callbacks else {
            return;
        };
        let mut bytes = Vec::new();
        encode::push(&mut bytes, a);
        if let Some((p, size, used)) = self.buffer {
            if used + bytes.len() > size {
                done.push((callbacks, p, size, used));
                self.buffer = None;
            }
        }
        if self.buffer.is_none() {
            let (p, size) = callbacks.request();
            if p.is_null() || size < MIN_BUFFER {
                return;
            }
            self.buffer = Some((p, size, 0));
        }
        if let Some((p, size, used)) = self.buffer.as_mut() {
            if *used + bytes.len() <= *size {
                // SAFETY: inside the client's buffer of `size` bytes.
                unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p.add(*used), bytes.len()) };
                *used += bytes.len();
            }
        }
    }

    /// Moves finished GPU work (all of it when `force`) into the buffer, and hands the
    /// buffer back (into `done`).
    fn flush(&mut self, force: bool, done: &mut Completed) {
        let now = realtime_ns();
        let mut keep = VecDeque::new();
        while let Some((end, a)) = self.pending.pop_front() {
            if force || end <= now {
                self.append(&a, done);
            } else {
                keep.push_back((end, a));
            }
        }
        self.pending = keep;
        if let (Some((p, size, used)), Some(callbacks)) = (self.buffer, self.callbacks) {
            if used > 0 || force {
                done.push((callbacks, p, size, used));
                self.buffer = None;
            }
        }
    }

    fn next_correlation(&mut self) -> u32 {
        self.correlation += 1;
        self.correlation
    }

    /// Queues GPU work of `duration_ns` on `stream`, starting no earlier than `after`; its
    /// (start, end).
    fn enqueue(&mut self, stream: u32, after: u64, duration_ns: u64) -> (u64, u64) {
        let busy = self.busy_until.entry(stream).or_insert(0);
        let start = (after + LAUNCH_LATENCY_NS).max(*busy);
        *busy = start + duration_ns;
        (start, start + duration_ns)
    }

    fn api(&mut self, cbid: u32, start: u64, correlation_id: u32, done: &mut Completed) {
        if self.on(kind::RUNTIME) && !self.quiet.contains(&cbid) {
            // SAFETY: getpid/gettid/pthread_self cannot fail.
            let (pid, tid) = unsafe {
                let tid = match self.thread_id_type {
                    1 => libc::gettid() as u32,
                    _ => libc::pthread_self() as u32,
                };
                (libc::getpid() as u32, tid)
            };
            let a = Activity::Api(Api {
                domain: ApiDomain::Runtime,
                cbid,
                start,
                end: realtime_ns(),
                process_id: pid,
                thread_id: tid,
                correlation_id,
                return_value: 0,
            });
            self.append(&a, done);
        }
    }
}

fn deliver(done: Completed) {
    for (callbacks, p, size, used) in done {
        callbacks.complete(p, size, used);
    }
}

/// `call()` when `handle` is our per-subscriber handle, else CUPTI's answer to a bad one.
fn for_subscriber(handle: *mut c_void, call: impl FnOnce() -> CuptiResult) -> CuptiResult {
    if ours(handle) {
        call()
    } else {
        result::INVALID_PARAMETER
    }
}

/// Whether `handle` is our per-subscriber handle.
fn ours(handle: *mut c_void) -> bool {
    std::ptr::eq(handle, &SUBSCRIBER as *const u8 as *mut c_void)
        && matches!(state().subscribed, Subscribed::PerSubscriber(_))
}

/// Interned kernel names: stable C strings, as CUPTI's are.
fn intern(name: &CStr) -> *const c_char {
    static NAMES: OnceLock<Mutex<HashMap<CString, Box<CStr>>>> = OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    names
        .entry(name.to_owned())
        .or_insert_with(|| name.to_owned().into_boxed_c_str())
        .as_ptr()
}

// ---- CUPTI entry points ----

/// `cuptiGetVersion`.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiGetVersion(v: *mut u32) -> CuptiResult {
    if v.is_null() {
        return result::INVALID_PARAMETER;
    }
    *v = api_version();
    result::SUCCESS
}

/// `cuptiGetResultString`.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiGetResultString(
    code: CuptiResult,
    s: *mut *const c_char,
) -> CuptiResult {
    static TEXT: OnceLock<Mutex<HashMap<CuptiResult, CString>>> = OnceLock::new();
    let Some(name) = result::name(code) else {
        return result::INVALID_PARAMETER;
    };
    if s.is_null() {
        return result::INVALID_PARAMETER;
    }
    let mut text = TEXT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let c = text
        .entry(code)
        .or_insert_with(|| CString::new(format!("CUPTI_ERROR_{name}")).unwrap_or_default());
    *s = c.as_ptr();
    result::SUCCESS
}

/// `cuptiSubscribe`: one subscriber at a time.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiSubscribe(
    handle: *mut *mut c_void,
    _callback: *const c_void,
    _userdata: *mut c_void,
) -> CuptiResult {
    let mut s = state();
    if s.subscribed != Subscribed::No || s.other.hold != 0 {
        return result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    if handle.is_null() {
        return result::INVALID_PARAMETER;
    }
    s.subscribed = Subscribed::Classic;
    *handle = std::ptr::dangling_mut::<c_void>();
    result::SUCCESS
}

/// `CUpti_SubscriberParams`, as the stand-in reads it.
#[repr(C)]
pub struct SubscriberParams {
    struct_size: usize,
    subscriber_name: *const c_char,
    old_subscriber_name: *mut c_char,
    old_subscriber_size: usize,
    allow_multiple_subscribers: u8,
    padding: [u8; 7],
}

/// `cuptiSubscribe_v2`: shares CUPTI when every subscriber allows it (and the "driver" can);
/// a refusal names the subscriber that does not share.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiSubscribe_v2(
    handle: *mut *mut c_void,
    _callback: *const c_void,
    _userdata: *mut c_void,
    params: *mut SubscriberParams,
) -> CuptiResult {
    if !has_v2() {
        return API_NOT_IMPLEMENTED;
    }
    if handle.is_null()
        || (!params.is_null() && (*params).struct_size < std::mem::size_of::<SubscriberParams>())
    {
        return result::INVALID_PARAMETER;
    }
    let allow = !params.is_null() && (*params).allow_multiple_subscribers != 0;
    let mut s = state();
    let sharing = std::env::var_os("STALLSCOPE_STANDIN_NO_SHARING").is_none();
    let refusal = match s.other.hold {
        _ if s.subscribed != Subscribed::No => Some(String::new()),
        1 => Some(s.other.name.clone()),
        2 if !allow => Some(s.other.name.clone()),
        _ if allow && !sharing => Some(String::new()),
        _ => None,
    };
    if let Some(name) = refusal {
        if !params.is_null() && !(*params).old_subscriber_name.is_null() {
            let p = &*params;
            let n = name.len().min(p.old_subscriber_size.saturating_sub(1));
            std::ptr::copy_nonoverlapping(name.as_ptr(), p.old_subscriber_name as *mut u8, n);
            *p.old_subscriber_name.add(n) = 0;
        }
        return result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    s.subscribed = Subscribed::PerSubscriber(allow);
    *handle = &SUBSCRIBER as *const u8 as *mut c_void;
    result::SUCCESS
}

/// `cuptiUnsubscribe`.
#[no_mangle]
pub extern "C" fn cuptiUnsubscribe(_handle: *mut c_void) -> CuptiResult {
    let mut s = state();
    match s.subscribed {
        Subscribed::No => return result::INVALID_PARAMETER,
        // A per-subscriber registration ends with its subscriber; classic activity state is
        // global and stays until cuptiFinalize.
        Subscribed::PerSubscriber(_) => {
            s.callbacks = None;
            s.enabled = 0;
            s.thread_id_type = 0;
            s.quiet.clear();
        }
        Subscribed::Classic => {}
    }
    s.subscribed = Subscribed::No;
    result::SUCCESS
}

/// `cuptiActivityRegisterCallbacks`.
#[no_mangle]
pub extern "C" fn cuptiActivityRegisterCallbacks(
    request: Option<Request>,
    complete: Option<Complete>,
) -> CuptiResult {
    match (request, complete) {
        (Some(r), Some(c)) => {
            state().callbacks = Some(Callbacks::Classic(r, c));
            result::SUCCESS
        }
        _ => result::INVALID_PARAMETER,
    }
}

/// `cuptiActivityRegisterCallbacks_v2`.
#[no_mangle]
pub extern "C" fn cuptiActivityRegisterCallbacks_v2(
    handle: *mut c_void,
    request: Option<RequestV2>,
    complete: Option<CompleteV2>,
) -> CuptiResult {
    match (ours(handle), request, complete) {
        (true, Some(r), Some(c)) => {
            state().callbacks = Some(Callbacks::PerSubscriber(r, c));
            result::SUCCESS
        }
        _ => result::INVALID_PARAMETER,
    }
}

/// `cuptiActivityEnable_v2`.
#[no_mangle]
pub extern "C" fn cuptiActivityEnable_v2(
    handle: *mut c_void,
    k: u32,
    _config: *mut c_void,
) -> CuptiResult {
    for_subscriber(handle, || cuptiActivityEnable(k))
}

/// `cuptiActivityDisable_v2`.
#[no_mangle]
pub extern "C" fn cuptiActivityDisable_v2(
    handle: *mut c_void,
    k: u32,
    _config: *mut c_void,
) -> CuptiResult {
    for_subscriber(handle, || cuptiActivityDisable(k))
}

/// `cuptiActivityGetNextRecord_v2`.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiActivityGetNextRecord_v2(
    handle: *mut c_void,
    buffer: *mut u8,
    valid: usize,
    record: *mut *mut u8,
) -> CuptiResult {
    for_subscriber(handle, || cuptiActivityGetNextRecord(buffer, valid, record))
}

/// `cuptiActivityGetNumDroppedRecords_v2`.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiActivityGetNumDroppedRecords_v2(
    handle: *mut c_void,
    context: *mut c_void,
    stream: u32,
    dropped: *mut usize,
) -> CuptiResult {
    for_subscriber(handle, || {
        cuptiActivityGetNumDroppedRecords(context, stream, dropped)
    })
}

/// `cuptiActivityEnable`.
#[no_mangle]
pub extern "C" fn cuptiActivityEnable(k: u32) -> CuptiResult {
    if k >= 64 {
        return INVALID_KIND;
    }
    let mut s = state();
    s.enabled |= 1 << k;
    // Enabling the kind turns each of its functions back on.
    if k == kind::RUNTIME {
        s.quiet.clear();
    }
    result::SUCCESS
}

/// `cuptiActivityDisable`.
#[no_mangle]
pub extern "C" fn cuptiActivityDisable(k: u32) -> CuptiResult {
    if k >= 64 {
        return INVALID_KIND;
    }
    state().enabled &= !(1 << k);
    result::SUCCESS
}

/// `cuptiActivityFlushAll`.
#[no_mangle]
pub extern "C" fn cuptiActivityFlushAll(flag: u32) -> CuptiResult {
    let mut done = Vec::new();
    state().flush(flag & FLUSH_FORCED != 0, &mut done);
    deliver(done);
    result::SUCCESS
}

/// `cuptiActivityGetNextRecord`: walks a buffer of CUPTI 13-sized records.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiActivityGetNextRecord(
    buffer: *mut u8,
    valid: usize,
    record: *mut *mut u8,
) -> CuptiResult {
    if buffer.is_null() || record.is_null() {
        return result::INVALID_PARAMETER;
    }
    let next = if (*record).is_null() {
        buffer
    } else {
        let k = ((*record) as *const u32).read_unaligned();
        (*record).add(encode::record_len(k))
    };
    if next.offset_from(buffer) as usize + 4 > valid {
        return result::MAX_LIMIT_REACHED;
    }
    *record = next;
    result::SUCCESS
}

/// `cuptiGetTimestamp`: CLOCK_REALTIME, CUPTI's default on Linux x86-64.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiGetTimestamp(t: *mut u64) -> CuptiResult {
    if t.is_null() {
        return result::INVALID_PARAMETER;
    }
    *t = realtime_ns();
    result::SUCCESS
}

/// `cuptiActivityGetNumDroppedRecords`: the stand-in never drops.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiActivityGetNumDroppedRecords(
    _context: *mut c_void,
    _stream: u32,
    dropped: *mut usize,
) -> CuptiResult {
    if dropped.is_null() {
        return result::INVALID_PARAMETER;
    }
    *dropped = 0;
    result::SUCCESS
}

/// `cuptiFinalize`: detaches CUPTI from the process (callbacks, kinds and subscribers gone,
/// a sharing tool's session with them). A tool holding CUPTI without sharing keeps its hold:
/// nobody else could have subscribed, so a finalize then comes from that tool itself.
#[no_mangle]
pub extern "C" fn cuptiFinalize() -> CuptiResult {
    let mut s = state();
    let other = if s.other.hold == 2 {
        Other::default()
    } else {
        s.other.clone()
    };
    *s = State {
        other,
        correlation: s.correlation,
        ..State::default()
    };
    result::SUCCESS
}

/// `cuptiGetThreadIdType` (refused once CUPTI is shared, as CUPTI documents).
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiGetThreadIdType(t: *mut u32) -> CuptiResult {
    let s = state();
    if t.is_null() {
        return result::INVALID_PARAMETER;
    }
    if s.subscribed == Subscribed::PerSubscriber(true) {
        return result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    *t = s.thread_id_type;
    result::SUCCESS
}

/// `cuptiSetThreadIdType` (as above).
#[no_mangle]
pub extern "C" fn cuptiSetThreadIdType(t: u32) -> CuptiResult {
    let mut s = state();
    if t > 1 {
        return result::INVALID_PARAMETER;
    }
    if s.subscribed == Subscribed::PerSubscriber(true) {
        return result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    s.thread_id_type = t;
    result::SUCCESS
}

/// `cuptiActivityEnableRuntimeApi`.
#[no_mangle]
pub extern "C" fn cuptiActivityEnableRuntimeApi(cbid: u32, enable: u8) -> CuptiResult {
    let mut s = state();
    if enable == 0 {
        s.quiet.insert(cbid);
    } else {
        s.quiet.remove(&cbid);
    }
    result::SUCCESS
}

/// `cuptiActivityEnableDriverApi` (the stand-in makes no driver records).
#[no_mangle]
pub extern "C" fn cuptiActivityEnableDriverApi(_cbid: u32, _enable: u8) -> CuptiResult {
    result::SUCCESS
}

/// `cuptiActivityEnableRuntimeApi_v2`.
#[no_mangle]
pub extern "C" fn cuptiActivityEnableRuntimeApi_v2(
    handle: *mut c_void,
    cbid: u32,
    enable: u8,
) -> CuptiResult {
    for_subscriber(handle, || cuptiActivityEnableRuntimeApi(cbid, enable))
}

/// `cuptiActivityEnableDriverApi_v2`.
#[no_mangle]
pub extern "C" fn cuptiActivityEnableDriverApi_v2(
    handle: *mut c_void,
    cbid: u32,
    enable: u8,
) -> CuptiResult {
    for_subscriber(handle, || cuptiActivityEnableDriverApi(cbid, enable))
}

/// `cuptiActivitySetAttribute_v2`: only `CUPTI_ACTIVITY_ATTR_THREAD_ID_TYPE`.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn cuptiActivitySetAttribute_v2(
    handle: *mut c_void,
    attr: u32,
    size: *mut usize,
    value: *mut c_void,
) -> CuptiResult {
    if !ours(handle) {
        return result::INVALID_PARAMETER;
    }
    if attr != cupti_sys::subscription::ATTR_THREAD_ID_TYPE
        || size.is_null()
        || *size != std::mem::size_of::<u32>()
        || value.is_null()
    {
        return API_NOT_IMPLEMENTED;
    }
    let t = *value.cast::<u32>();
    if t > 1 {
        return result::INVALID_PARAMETER;
    }
    state().thread_id_type = t;
    result::SUCCESS
}

// ---- test hooks ----

/// Another tool named `name` holds the subscriber slot without sharing it (`hold` 1), holds
/// it sharing (2), or lets go (0).
#[no_mangle]
///
/// # Safety
/// `name` is null or a NUL-terminated string.
pub unsafe extern "C" fn stallscope_standin_hold(hold: i32, name: *const c_char) {
    let name = if name.is_null() {
        String::new()
    } else {
        CStr::from_ptr(name).to_string_lossy().into_owned()
    };
    state().other = Other { hold, name };
}

/// What CUPTI holds for our client now: bit 0 a subscriber, bit 1 registered callbacks, bit 2
/// the subscriber shares CUPTI, bits 8.. the number of enabled kinds (0 once the client has
/// given everything back); bit 4: another tool still holds its slot; bit 5: API records carry
/// other thread ids than CUPTI's default.
#[no_mangle]
pub extern "C" fn stallscope_standin_state() -> u64 {
    let s = state();
    u64::from(s.subscribed != Subscribed::No)
        | u64::from(s.callbacks.is_some()) << 1
        | u64::from(s.subscribed == Subscribed::PerSubscriber(true)) << 2
        | u64::from(s.other.hold != 0) << 4
        | u64::from(s.thread_id_type != 0) << 5
        | u64::from(s.enabled.count_ones()) << 8
}

/// `cudaLaunchKernel` of `name` running `duration_ns` on `stream`; its correlation id.
#[no_mangle]
///
/// # Safety
/// Pointer arguments as CUPTI documents them: valid for the accesses the call makes.
pub unsafe extern "C" fn stallscope_standin_launch(
    name: *const c_char,
    duration_ns: u64,
    stream: u32,
) -> u32 {
    let t0 = realtime_ns();
    let name = if name.is_null() {
        c"kernel"
    } else {
        CStr::from_ptr(name)
    };
    let mut done = Vec::new();
    let mut s = state();
    let query = s.next_correlation();
    s.api(CBID_GET_DEVICE, t0, query, &mut done);
    let corr = s.next_correlation();
    s.api(CBID_LAUNCH_KERNEL, t0, corr, &mut done);
    let (start, end) = s.enqueue(stream, realtime_ns(), duration_ns);
    if s.on(kind::CONCURRENT_KERNEL) || s.on(kind::KERNEL) {
        let k = Kernel {
            start,
            end,
            device_id: 0,
            context_id: 1,
            stream_id: stream,
            correlation_id: corr,
            grid: [108, 1, 1],
            block: [256, 1, 1],
            registers_per_thread: 32,
            name_ptr: intern(name) as u64,
            ..Kernel::default()
        };
        s.pending.push_back((end, Activity::Kernel(k)));
    }
    drop(s);
    deliver(done);
    corr
}

/// `cudaMemcpyAsync` host to device of `bytes` taking `duration_ns` on `stream`.
#[no_mangle]
pub extern "C" fn stallscope_standin_memcpy(bytes: u64, duration_ns: u64, stream: u32) -> u32 {
    let t0 = realtime_ns();
    let mut done = Vec::new();
    let mut s = state();
    let corr = s.next_correlation();
    s.api(CBID_MEMCPY_ASYNC, t0, corr, &mut done);
    let (start, end) = s.enqueue(stream, realtime_ns(), duration_ns);
    if s.on(kind::MEMCPY) {
        let m = Memcpy {
            copy_kind: 1,
            src_kind: 2,
            dst_kind: 3,
            bytes,
            start,
            end,
            device_id: 0,
            context_id: 1,
            stream_id: stream,
            correlation_id: corr,
        };
        s.pending.push_back((end, Activity::Memcpy(m)));
    }
    drop(s);
    deliver(done);
    corr
}

/// `cudaStreamSynchronize(stream)`: really waits until the simulated stream drains.
#[no_mangle]
pub extern "C" fn stallscope_standin_synchronize(stream: u32) {
    let t0 = realtime_ns();
    let until = state().busy_until.get(&stream).copied().unwrap_or(0);
    let now = realtime_ns();
    if until > now {
        std::thread::sleep(std::time::Duration::from_nanos(until - now));
    }
    let mut done = Vec::new();
    let mut s = state();
    let corr = s.next_correlation();
    s.api(CBID_STREAM_SYNCHRONIZE, t0, corr, &mut done);
    if s.on(kind::SYNCHRONIZATION) {
        let a = Activity::Synchronization(Synchronization {
            sync_type: 3,
            start: t0,
            end: realtime_ns(),
            correlation_id: corr,
            context_id: 1,
            stream_id: stream,
            cuda_event_id: u32::MAX,
        });
        s.append(&a, &mut done);
    }
    drop(s);
    deliver(done);
}
