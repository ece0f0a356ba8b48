//! libcupti loaded with `dlopen`: the copy already mapped in the process first (torch maps
//! its wheel's libcupti at `import torch`, outside the default search path), then the usual
//! sonames. Required entry points fail the load with their name; optional ones are `None`.

use std::{
    ffi::c_void,
    path::{Path, PathBuf},
};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use crate::result::{self, CuptiResult};

/// `CUpti_SubscriberHandle`.
pub type SubscriberHandle = *mut c_void;
/// `CUpti_CallbackFunc`: (userdata, domain, cbid, cbdata).
pub type CallbackFunc = unsafe extern "C" fn(*mut c_void, u32, u32, *const c_void);
/// `CUpti_BuffersCallbackRequestFunc`: (buffer, size, maxNumRecords).
pub type BufferRequestedFunc = unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize);
/// `CUpti_BuffersCallbackCompleteFunc`: (context, streamId, buffer, size, validSize).
pub type BufferCompletedFunc = unsafe extern "C" fn(*mut c_void, u32, *mut u8, usize, usize);

/// `CUpti_BuffersCallbackRequestFunc_v2`: (buffer, size, maxNumRecords, requestInfo).
pub type BufferRequestedFuncV2 =
    unsafe extern "C" fn(*mut *mut u8, *mut usize, *mut usize, *mut c_void);
/// `CUpti_BuffersCallbackCompleteFunc_v2`: (buffer, size, validSize, completeInfo).
pub type BufferCompletedFuncV2 = unsafe extern "C" fn(*mut u8, usize, usize, *mut c_void);

/// The first `CUPTI_API_VERSION` whose subscribers can share CUPTI (CUDA 13.3).
pub const MULTI_SUBSCRIBER_SINCE: u32 = 130300;

/// Sonames tried, newest first.
pub const SONAMES: [&str; 3] = ["libcupti.so.13", "libcupti.so.12", "libcupti.so"];

/// The entry points stallscope calls, resolved from one loaded libcupti.
pub struct Cupti {
    /// Where it was loaded from (a path from /proc/self/maps, or a soname).
    pub origin: String,
    /// Whether it was already mapped in the process before we looked.
    pub was_mapped: bool,
    /// `cuptiSubscribe`.
    pub subscribe:
        unsafe extern "C" fn(*mut SubscriberHandle, CallbackFunc, *mut c_void) -> CuptiResult,
    /// `cuptiUnsubscribe`.
    pub unsubscribe: unsafe extern "C" fn(SubscriberHandle) -> CuptiResult,
    /// `cuptiActivityEnable`.
    pub activity_enable: unsafe extern "C" fn(u32) -> CuptiResult,
    /// `cuptiActivityDisable`.
    pub activity_disable: unsafe extern "C" fn(u32) -> CuptiResult,
    /// `cuptiActivityRegisterCallbacks`.
    pub activity_register_callbacks:
        unsafe extern "C" fn(BufferRequestedFunc, BufferCompletedFunc) -> CuptiResult,
    /// `cuptiActivityFlushAll`.
    pub activity_flush_all: unsafe extern "C" fn(u32) -> CuptiResult,
    /// `cuptiActivityGetNextRecord`.
    pub activity_get_next_record: unsafe extern "C" fn(*mut u8, usize, *mut *mut u8) -> CuptiResult,
    /// `cuptiGetTimestamp`.
    pub get_timestamp: unsafe extern "C" fn(*mut u64) -> CuptiResult,
    /// `cuptiGetVersion` (optional).
    pub get_version: Option<unsafe extern "C" fn(*mut u32) -> CuptiResult>,
    /// `cuptiActivityGetNumDroppedRecords` (optional): (context, streamId, dropped).
    pub activity_get_num_dropped_records:
        Option<unsafe extern "C" fn(*mut c_void, u32, *mut usize) -> CuptiResult>,
    /// `cuptiFinalize` (optional).
    pub finalize: Option<unsafe extern "C" fn() -> CuptiResult>,
    /// `cuptiGetThreadIdType` (optional; process-wide, refused with multiple subscribers).
    pub get_thread_id_type: Option<unsafe extern "C" fn(*mut u32) -> CuptiResult>,
    /// `cuptiSetThreadIdType` (optional; as above).
    pub set_thread_id_type: Option<unsafe extern "C" fn(u32) -> CuptiResult>,
    /// `cuptiActivityEnableRuntimeApi` (optional, CUPTI 12.6+): (cbid, enable).
    pub activity_enable_runtime_api: Option<unsafe extern "C" fn(u32, u8) -> CuptiResult>,
    /// `cuptiActivityEnableDriverApi` (optional, CUPTI 12.6+): (cbid, enable).
    pub activity_enable_driver_api: Option<unsafe extern "C" fn(u32, u8) -> CuptiResult>,
    /// The per-subscriber API, in a CUPTI that can share ([`MULTI_SUBSCRIBER_SINCE`]) and has
    /// every entry point of it.
    pub v2: Option<CuptiV2>,
    _lib: Library,
}

/// CUPTI's per-subscriber (multi-subscriber) entry points.
pub struct CuptiV2 {
    /// `cuptiSubscribe_v2`.
    pub subscribe: unsafe extern "C" fn(
        *mut SubscriberHandle,
        CallbackFunc,
        *mut c_void,
        *mut crate::subscription::SubscriberParams,
    ) -> CuptiResult,
    /// `cuptiActivityEnable_v2`: (subscriber, kind, config or NULL).
    pub activity_enable: unsafe extern "C" fn(SubscriberHandle, u32, *mut c_void) -> CuptiResult,
    /// `cuptiActivityDisable_v2`.
    pub activity_disable: unsafe extern "C" fn(SubscriberHandle, u32, *mut c_void) -> CuptiResult,
    /// `cuptiActivityRegisterCallbacks_v2`.
    pub activity_register_callbacks: unsafe extern "C" fn(
        SubscriberHandle,
        BufferRequestedFuncV2,
        BufferCompletedFuncV2,
    ) -> CuptiResult,
    /// `cuptiActivityGetNextRecord_v2`.
    pub activity_get_next_record:
        unsafe extern "C" fn(SubscriberHandle, *mut u8, usize, *mut *mut u8) -> CuptiResult,
    /// `cuptiActivityGetNumDroppedRecords_v2` (optional): (subscriber, context, streamId, dropped).
    pub activity_get_num_dropped_records:
        Option<unsafe extern "C" fn(SubscriberHandle, *mut c_void, u32, *mut usize) -> CuptiResult>,
    /// `cuptiActivitySetAttribute_v2` (optional): (subscriber, attribute, value size, value).
    pub activity_set_attribute:
        Option<unsafe extern "C" fn(SubscriberHandle, u32, *mut usize, *mut c_void) -> CuptiResult>,
    /// `cuptiActivityEnableRuntimeApi_v2` (optional): (subscriber, cbid, enable).
    pub activity_enable_runtime_api:
        Option<unsafe extern "C" fn(SubscriberHandle, u32, u8) -> CuptiResult>,
    /// `cuptiActivityEnableDriverApi_v2` (optional): (subscriber, cbid, enable).
    pub activity_enable_driver_api:
        Option<unsafe extern "C" fn(SubscriberHandle, u32, u8) -> CuptiResult>,
}

/// Why libcupti could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// No libcupti could be opened; the `dlopen` errors, one per name tried.
    NotFound(Vec<String>),
    /// A required entry point is missing from the library at `origin`.
    MissingSymbol {
        /// The library.
        origin: String,
        /// The entry point.
        symbol: &'static str,
    },
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NotFound(e) => write!(
                f,
                "no libcupti in this process or on the library path ({}); install the CUDA toolkit's CUPTI or the nvidia-cuda-cupti wheel",
                e.join("; ")
            ),
            LoadError::MissingSymbol { origin, symbol } => {
                write!(f, "{origin} has no {symbol}: not a CUPTI 12/13 library")
            }
        }
    }
}

impl std::error::Error for LoadError {}

/// Paths of the libcupti objects mapped into the current process.
pub fn mapped_paths() -> Vec<PathBuf> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut out: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|p| {
            Path::new(p)
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libcupti.so"))
        })
        .map(PathBuf::from)
        .collect();
    out.dedup();
    out
}

fn open(name: &std::ffi::OsStr, flags: i32) -> Result<Library, String> {
    // SAFETY: opening a shared library runs its constructors; libcupti's are benign, and a
    // copy already mapped (RTLD_NOLOAD) runs none.
    unsafe { Library::open(Some(name), flags) }.map_err(|e| e.to_string())
}

impl Cupti {
    /// Loads libcupti: a copy already mapped in this process (by path from /proc/self/maps,
    /// then by soname with RTLD_NOLOAD), else the first of [`SONAMES`] `dlopen` finds.
    pub fn load() -> Result<Cupti, LoadError> {
        let mut errors = Vec::new();
        let mapped = mapped_paths()
            .into_iter()
            .map(PathBuf::into_os_string)
            .chain(SONAMES.iter().map(Into::into));
        for name in mapped {
            match open(&name, RTLD_NOW | RTLD_LOCAL | libc::RTLD_NOLOAD) {
                Ok(lib) => return Self::resolve(lib, name.to_string_lossy().into_owned(), true),
                Err(e) => errors.push(e),
            }
        }
        errors.clear();
        for name in SONAMES {
            match open(name.as_ref(), RTLD_NOW | RTLD_LOCAL) {
                Ok(lib) => return Self::resolve(lib, name.to_string(), false),
                Err(e) => errors.push(e),
            }
        }
        Err(LoadError::NotFound(errors))
    }

    /// Loads the library at `path` (a stand-in, or a specific install).
    pub fn load_from(path: &Path) -> Result<Cupti, LoadError> {
        let lib = open(path.as_os_str(), RTLD_NOW | RTLD_LOCAL)
            .map_err(|e| LoadError::NotFound(vec![e]))?;
        Self::resolve(lib, path.display().to_string(), false)
    }

    fn resolve(lib: Library, origin: String, was_mapped: bool) -> Result<Cupti, LoadError> {
        macro_rules! required {
            ($name:literal) => {
                // SAFETY: the symbol is declared with CUPTI's documented C signature.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|_| {
                    LoadError::MissingSymbol {
                        origin: origin.clone(),
                        symbol: $name,
                    }
                })?
            };
        }
        macro_rules! optional {
            ($name:literal) => {
                // SAFETY: as above.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .ok()
                    .map(|s| *s)
            };
        }
        let get_version: Option<unsafe extern "C" fn(*mut u32) -> CuptiResult> =
            optional!("cuptiGetVersion");
        let mut version = 0;
        // SAFETY: documented signature; `version` outlives the call.
        let shares = get_version.is_some_and(|f| unsafe { f(&mut version) } == result::SUCCESS)
            && version >= MULTI_SUBSCRIBER_SINCE;
        let v2 = (|| {
            Some(CuptiV2 {
                subscribe: optional!("cuptiSubscribe_v2")?,
                activity_enable: optional!("cuptiActivityEnable_v2")?,
                activity_disable: optional!("cuptiActivityDisable_v2")?,
                activity_register_callbacks: optional!("cuptiActivityRegisterCallbacks_v2")?,
                activity_get_next_record: optional!("cuptiActivityGetNextRecord_v2")?,
                activity_get_num_dropped_records: optional!("cuptiActivityGetNumDroppedRecords_v2"),
                activity_set_attribute: optional!("cuptiActivitySetAttribute_v2"),
                activity_enable_runtime_api: optional!("cuptiActivityEnableRuntimeApi_v2"),
                activity_enable_driver_api: optional!("cuptiActivityEnableDriverApi_v2"),
            })
        })()
        .filter(|_| shares);
        Ok(Cupti {
            subscribe: required!("cuptiSubscribe"),
            unsubscribe: required!("cuptiUnsubscribe"),
            activity_enable: required!("cuptiActivityEnable"),
            activity_disable: required!("cuptiActivityDisable"),
            activity_register_callbacks: required!("cuptiActivityRegisterCallbacks"),
            activity_flush_all: required!("cuptiActivityFlushAll"),
            activity_get_next_record: required!("cuptiActivityGetNextRecord"),
            get_timestamp: required!("cuptiGetTimestamp"),
            get_version,
            activity_get_num_dropped_records: optional!("cuptiActivityGetNumDroppedRecords"),
            finalize: optional!("cuptiFinalize"),
            get_thread_id_type: optional!("cuptiGetThreadIdType"),
            set_thread_id_type: optional!("cuptiSetThreadIdType"),
            activity_enable_runtime_api: optional!("cuptiActivityEnableRuntimeApi"),
            activity_enable_driver_api: optional!("cuptiActivityEnableDriverApi"),
            v2,
            origin,
            was_mapped,
            _lib: lib,
        })
    }

    /// `cuptiGetVersion`, when the library has it and it succeeds.
    pub fn version(&self) -> Option<u32> {
        let f = self.get_version?;
        let mut v = 0;
        // SAFETY: documented signature; `v` outlives the call.
        (unsafe { f(&mut v) } == result::SUCCESS).then_some(v)
    }

    /// `cuptiGetTimestamp`.
    pub fn timestamp(&self) -> Result<u64, result::CuptiError> {
        let mut t = 0;
        // SAFETY: documented signature; `t` outlives the call.
        result::check("cuptiGetTimestamp", unsafe { (self.get_timestamp)(&mut t) })?;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_names_what_was_tried_and_the_fix() {
        let e = Cupti::load_from(Path::new("/nonexistent/libcupti.so.13"))
            .err()
            .expect("no such file");
        let s = e.to_string();
        assert!(s.contains("/nonexistent/libcupti.so.13"), "{s}");
        assert!(s.contains("nvidia-cuda-cupti"), "{s}");
    }

    #[test]
    fn a_library_without_cupti_symbols_is_refused_by_name() {
        // libc is mapped in every process and has none of CUPTI's entry points.
        let e = Cupti::load_from(Path::new("libc.so.6"))
            .err()
            .expect("not CUPTI");
        assert!(e.to_string().contains("has no cuptiSubscribe"), "{e}");
    }

    #[test]
    fn nothing_is_mapped_in_a_process_without_cuda() {
        assert!(mapped_paths().is_empty());
    }
}
