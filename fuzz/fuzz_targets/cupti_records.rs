//! CUPTI activity records as a buffer may hold them: any kind, any length. Decoding returns
//! an activity or `Truncated`, never reads past the record.
#![no_main]

use cupti_sys::record::{decode, min_len, walk};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(_activity) = decode(data) {
        let kind = u32::from_le_bytes(data[..4].try_into().expect("decoded: 4 bytes"));
        assert!(data.len() >= min_len(kind));
    }
    for r in walk(data) {
        let _ = r.map_err(|t| t.to_string());
    }
});
