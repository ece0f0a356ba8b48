//! A configuration file laid over the embedded default: accepted only when every setting
//! validates, otherwise refused with an error naming the file, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use probe_user::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::parse_over_default(text, "fuzz.toml") {
        Ok(c) => c.validate().expect("an accepted configuration validates"),
        Err(e) => assert!(format!("{e:#}").contains("fuzz.toml"), "{e:#}"),
    }
});
