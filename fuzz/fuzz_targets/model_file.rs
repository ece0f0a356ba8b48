//! A model file as the disk may hold it: `from_json` refuses what prediction cannot use, and
//! prediction of an accepted model never panics, whatever the workload.
#![no_main]

use libfuzzer_sys::fuzz_target;
use model::{Baseline, Workload};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(b) = Baseline::from_json(text) else {
        return;
    };
    for w in [
        Workload::default(),
        Workload {
            batch: 8.0,
            input_len: 512.0,
            output_len: 64.0,
            tokens: 8.0,
            overlap_tokens: 0.0,
        },
        Workload {
            batch: f64::NAN,
            input_len: f64::INFINITY,
            output_len: -1.0,
            tokens: f64::MAX,
            overlap_tokens: 0.0,
        },
    ] {
        let _ = b.predict(&w);
    }
    let _ = b.to_json();
});
