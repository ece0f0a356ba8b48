//! `CUptiResult` codes as plain integers, with their names for error messages.

/// A `CUptiResult`.
pub type CuptiResult = u32;

/// `CUPTI_SUCCESS`.
pub const SUCCESS: CuptiResult = 0;
/// `CUPTI_ERROR_INVALID_PARAMETER`.
pub const INVALID_PARAMETER: CuptiResult = 1;
/// `CUPTI_ERROR_MAX_LIMIT_REACHED`: also the end of a buffer for `cuptiActivityGetNextRecord`.
pub const MAX_LIMIT_REACHED: CuptiResult = 12;
/// `CUPTI_ERROR_NOT_COMPATIBLE`.
pub const NOT_COMPATIBLE: CuptiResult = 14;
/// `CUPTI_ERROR_NOT_INITIALIZED`.
pub const NOT_INITIALIZED: CuptiResult = 15;
/// `CUPTI_ERROR_INSUFFICIENT_PRIVILEGES`.
pub const INSUFFICIENT_PRIVILEGES: CuptiResult = 35;
/// `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED`: another tool holds the subscriber slot.
pub const MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: CuptiResult = 39;
/// `CUPTI_ERROR_UNKNOWN`: what every call returns when no CUDA driver is present.
pub const UNKNOWN: CuptiResult = 999;

/// The `CUPTI_ERROR_*` name of `r` (without the prefix), for messages; `None` for codes this
/// crate does not name.
pub fn name(r: CuptiResult) -> Option<&'static str> {
    Some(match r {
        SUCCESS => "SUCCESS",
        INVALID_PARAMETER => "INVALID_PARAMETER",
        2 => "INVALID_DEVICE",
        3 => "INVALID_CONTEXT",
        7 => "INVALID_OPERATION",
        8 => "OUT_OF_MEMORY",
        11 => "API_NOT_IMPLEMENTED",
        MAX_LIMIT_REACHED => "MAX_LIMIT_REACHED",
        13 => "NOT_READY",
        NOT_COMPATIBLE => "NOT_COMPATIBLE",
        NOT_INITIALIZED => "NOT_INITIALIZED",
        18 => "QUEUE_EMPTY",
        19 => "INVALID_HANDLE",
        21 => "INVALID_KIND",
        23 => "DISABLED",
        27 => "NOT_SUPPORTED",
        INSUFFICIENT_PRIVILEGES => "INSUFFICIENT_PRIVILEGES",
        MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => "MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
        40 => "VIRTUALIZED_DEVICE_INSUFFICIENT_PRIVILEGES",
        43 => "MIG_DEVICE_NOT_SUPPORTED",
        UNKNOWN => "UNKNOWN",
        _ => return None,
    })
}

/// A failed CUPTI call: which entry point, and its result code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CuptiError {
    /// The entry point, e.g. `cuptiSubscribe`.
    pub call: &'static str,
    /// Its result code.
    pub code: CuptiResult,
}

impl std::fmt::Display for CuptiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match name(self.code) {
            Some(n) => write!(f, "{} failed: CUPTI_ERROR_{n} ({})", self.call, self.code),
            None => write!(f, "{} failed: CUPTI result {}", self.call, self.code),
        }?;
        match self.code {
            UNKNOWN => write!(f, " (no usable CUDA driver in this process?)"),
            MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED => write!(
                f,
                " (another CUPTI client, e.g. torch.profiler or Nsight, holds the subscriber slot)"
            ),
            INSUFFICIENT_PRIVILEGES => write!(
                f,
                " (GPU profiling is restricted: NVreg_RestrictProfilingToAdminUsers)"
            ),
            _ => Ok(()),
        }
    }
}

impl std::error::Error for CuptiError {}

/// `Ok(())` for [`SUCCESS`], else the error naming `call`.
pub fn check(call: &'static str, code: CuptiResult) -> Result<(), CuptiError> {
    if code == SUCCESS {
        Ok(())
    } else {
        Err(CuptiError { call, code })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_call_the_code_and_a_hint() {
        assert_eq!(check("cuptiGetTimestamp", SUCCESS), Ok(()));
        let e = check("cuptiSubscribe", MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED).unwrap_err();
        let s = e.to_string();
        assert!(
            s.starts_with(
                "cuptiSubscribe failed: CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED (39)"
            ),
            "{s}"
        );
        assert!(s.contains("torch.profiler"), "{s}");
        let s = check("cuptiActivityEnable", 4242).unwrap_err().to_string();
        assert_eq!(s, "cuptiActivityEnable failed: CUPTI result 4242");
    }
}
