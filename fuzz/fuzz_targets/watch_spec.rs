//! Watch specs from the configuration and the command line: parsed or refused with an error
//! that names the spec.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyframe_tracer::WatchSpec;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = text.parse::<WatchSpec>() {
        assert!(spec.fields.len() <= pyframe_tracer::ring::MAX_FIELDS);
    }
});
