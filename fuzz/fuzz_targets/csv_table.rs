//! A workload table (`stallscope model fit/predict` input): parsed into rows or refused with
//! an error, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for need_duration in [false, true] {
        if let Err(e) = model::dataset::parse_csv(text, need_duration) {
            let _ = e.to_string();
        }
    }
});
