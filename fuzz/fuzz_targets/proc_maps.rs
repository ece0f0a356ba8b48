//! /proc text the attach reads: `maps` lines and `status` fields, whatever the bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyframe_tracer::{maps, procfs};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for m in maps::parse(&text) {
        let _ = m.file_name();
    }
    for key in ["TracerPid", "State", "Tgid", "NSpid", ""] {
        let _ = procfs::status_field(&text, key);
    }
});
