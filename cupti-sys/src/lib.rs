//! Hand-written minimal CUPTI FFI for stallscope's GPU plane.
//!
//! No NVIDIA header is used or shipped: the few entry points the agent calls are declared here
//! by hand and resolved with `dlopen` at run time ([`library`]), result codes and activity kinds
//! are plain integers ([`result`], [`kind`]), and activity records are decoded from their
//! documented byte offsets ([`record`]). The offsets read are the same in CUPTI 12.9, 13.0 and
//! 13.x (Kernel9/10/13, Memcpy6/7, Memset4/5, API, Synchronization2, ExternalCorrelation);
//! `tests/layout.rs` checks them against the headers of the `nvidia-cuda-cupti` wheels when
//! those can be downloaded. [`subscription`] takes CUPTI's subscriber slot (shared with other
//! tools where CUPTI >= 13.3 allows it, never fought for), and [`channel`] is the shared-memory
//! format between the injected agent and the daemon, [`sampling`] the share of the time it
//! traces.

pub mod channel;
pub mod library;
pub mod record;
pub mod result;
pub mod sampling;
pub mod subscription;

/// Activity kinds (`CUpti_ActivityKind`) the agent enables, as plain integers: a kind this
/// crate does not know is carried as a number, never transmuted into an enum.
pub mod kind {
    /// `CUPTI_ACTIVITY_KIND_MEMCPY`.
    pub const MEMCPY: u32 = 1;
    /// `CUPTI_ACTIVITY_KIND_MEMSET`.
    pub const MEMSET: u32 = 2;
    /// `CUPTI_ACTIVITY_KIND_KERNEL` (serialised kernels).
    pub const KERNEL: u32 = 3;
    /// `CUPTI_ACTIVITY_KIND_DRIVER` (driver API calls).
    pub const DRIVER: u32 = 4;
    /// `CUPTI_ACTIVITY_KIND_RUNTIME` (runtime API calls).
    pub const RUNTIME: u32 = 5;
    /// `CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`.
    pub const CONCURRENT_KERNEL: u32 = 10;
    /// `CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`.
    pub const SYNCHRONIZATION: u32 = 38;
    /// `CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION`.
    pub const EXTERNAL_CORRELATION: u32 = 39;
}

/// `cuptiActivityFlushAll` flag that also flushes records of activities still in flight.
pub const FLUSH_FORCED: u32 = 1;

/// `CUpti_ActivityMemcpyKind` values worth naming in a trace.
pub fn memcpy_kind_name(k: u8) -> &'static str {
    match k {
        1 => "HtoD",
        2 => "DtoH",
        3 => "HtoA",
        4 => "AtoH",
        5 => "AtoA",
        6 => "AtoD",
        7 => "DtoA",
        8 => "DtoD",
        9 => "HtoH",
        10 => "PtoP",
        _ => "memcpy",
    }
}

/// `CUpti_ActivitySynchronizationType` values.
pub fn synchronization_name(t: u32) -> &'static str {
    match t {
        1 => "cudaEventSynchronize",
        2 => "cudaStreamWaitEvent",
        3 => "cudaStreamSynchronize",
        4 => "cudaDeviceSynchronize",
        _ => "synchronization",
    }
}

/// Runtime API functions named in traces, by callback id (`CUpti_runtime_api_trace_cbid`).
pub const RUNTIME_API: [(u32, &str); 17] = [
    (20, "cudaMalloc"),
    (22, "cudaFree"),
    (27, "cudaHostAlloc"),
    (31, "cudaMemcpy"),
    (41, "cudaMemcpyAsync"),
    (44, "cudaMemcpy2DAsync"),
    (51, "cudaMemsetAsync"),
    (131, "cudaStreamSynchronize"),
    (135, "cudaEventRecord"),
    (137, "cudaEventSynchronize"),
    (138, "cudaEventQuery"),
    (147, "cudaStreamWaitEvent"),
    (165, "cudaDeviceSynchronize"),
    (211, "cudaLaunchKernel"),
    (311, "cudaGraphLaunch"),
    (317, "cudaStreamIsCapturing"),
    (430, "cudaLaunchKernelExC"),
];

/// Driver API functions named in traces, by callback id (`CUpti_driver_api_trace_cbid`).
pub const DRIVER_API: [(u32, &str); 15] = [
    (17, "cuCtxSynchronize"),
    (119, "cuEventRecord"),
    (121, "cuEventSynchronize"),
    (126, "cuStreamSynchronize"),
    (216, "cuMemsetD8Async"),
    (220, "cuMemsetD32Async"),
    (243, "cuMemAlloc_v2"),
    (245, "cuMemFree_v2"),
    (277, "cuMemcpyHtoDAsync_v2"),
    (279, "cuMemcpyDtoHAsync_v2"),
    (295, "cuStreamWaitEvent"),
    (306, "cuMemcpyAsync"),
    (307, "cuLaunchKernel"),
    (514, "cuGraphLaunch"),
    (652, "cuLaunchKernelEx"),
];

/// Runtime API functions whose records are turned off ([`subscription::Subscription::quiet`]):
/// queries that do no GPU work, made around nearly every launch by PyTorch and Triton. On an
/// eager PyTorch decode loop on an H100 they were 13 of every 14 API records (cudaGetDevice
/// alone 8 per kernel), each costing the calling thread its record's time.
pub const QUIET_RUNTIME_API: [(u32, &str); 16] = [
    (1, "cudaDriverGetVersion"),
    (2, "cudaRuntimeGetVersion"),
    (3, "cudaGetDeviceCount"),
    (4, "cudaGetDeviceProperties"),
    (10, "cudaGetLastError"),
    (11, "cudaPeekAtLastError"),
    (12, "cudaGetErrorString"),
    (15, "cudaFuncGetAttributes"),
    (16, "cudaSetDevice"),
    (17, "cudaGetDevice"),
    (151, "cudaPointerGetAttributes"),
    (200, "cudaDeviceGetAttribute"),
    (317, "cudaStreamIsCapturing"),
    (318, "cudaStreamIsCapturing_ptsz"),
    (324, "cudaStreamGetCaptureInfo"),
    (409, "cudaStreamGetCaptureInfo_v2"),
];

/// Driver API functions whose records are turned off, as [`QUIET_RUNTIME_API`].
pub const QUIET_DRIVER_API: [(u32, &str); 26] = [
    (2, "cuDriverGetVersion"),
    (3, "cuDeviceGet"),
    (4, "cuDeviceGetCount"),
    (9, "cuDeviceGetAttribute"),
    (16, "cuCtxGetDevice"),
    (85, "cuFuncGetAttribute"),
    (137, "cuCtxGetLimit"),
    (303, "cuCtxSetCurrent"),
    (304, "cuCtxGetCurrent"),
    (310, "cuPointerGetAttribute"),
    (372, "cuGetErrorString"),
    (392, "cuDevicePrimaryCtxGetState"),
    (450, "cuPointerGetAttributes"),
    (451, "cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"),
    (499, "cuStreamIsCapturing"),
    (500, "cuStreamIsCapturing_ptsz"),
    (536, "cuStreamGetCaptureInfo"),
    (626, "cuGetProcAddress"),
    (629, "cuStreamGetCaptureInfo_v2"),
    (677, "cuGetProcAddress_v2"),
    (683, "cuKernelGetFunction"),
    (686, "cuKernelGetAttribute"),
    (687, "cuKernelSetAttribute"),
    (719, "cuKernelGetName"),
    (729, "cuStreamGetCaptureInfo_v3"),
    (795, "cuCtxGetDevice_v2"),
];

/// The name of an API call for a trace: the function when known, else the domain and id.
pub fn api_name(domain: record::ApiDomain, cbid: u32) -> std::borrow::Cow<'static, str> {
    let (table, prefix): (&[(u32, &str)], &str) = match domain {
        record::ApiDomain::Runtime => (&RUNTIME_API, "cuda runtime"),
        record::ApiDomain::Driver => (&DRIVER_API, "cuda driver"),
    };
    match table.binary_search_by_key(&cbid, |(id, _)| *id) {
        Ok(i) => table[i].1.into(),
        Err(_) => format!("{prefix} #{cbid}").into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_names_come_from_sorted_tables() {
        assert!(RUNTIME_API.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(DRIVER_API.windows(2).all(|w| w[0].0 < w[1].0));
        // No function that can do GPU work is quieted.
        for (quiet, named) in [
            (&QUIET_RUNTIME_API[..], &RUNTIME_API[..]),
            (&QUIET_DRIVER_API[..], &DRIVER_API[..]),
        ] {
            assert!(quiet.windows(2).all(|w| w[0].0 < w[1].0));
            for (id, name) in named {
                let q = quiet.iter().find(|(q, _)| q == id);
                assert!(
                    q.is_none() || name.contains("Capturing"),
                    "{name} is quieted"
                );
            }
        }
        assert_eq!(
            api_name(record::ApiDomain::Runtime, 211),
            "cudaLaunchKernel"
        );
        assert_eq!(api_name(record::ApiDomain::Driver, 307), "cuLaunchKernel");
        assert_eq!(
            api_name(record::ApiDomain::Driver, 9999),
            "cuda driver #9999"
        );
    }
}
