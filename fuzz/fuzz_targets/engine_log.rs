//! vLLM's log lines (read to check iterations and measure slowdowns): parsed or skipped.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for it in vllm_log::parse(&text) {
        let _ = (it.batch(), it.tokens(), it.stamp.map(|s| s.unix_s(2026)));
    }
});
