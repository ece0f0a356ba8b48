//! The GPU agent's channel as the target may leave it: any header, sequence numbers, error
//! text and slots. The daemon must open only a channel that fits its mapping, drain at most
//! one ring's worth per call, and reassemble names within their bounds.
#![no_main]

use cupti_sys::channel::{file_len, Channel, Names, HEADER, MAX_NAME, SLOT};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    // A mapping of the input rounded down to whole slots past the header (at least the
    // header), 8-aligned as a page-aligned mapping is.
    let len = HEADER.max(HEADER + (data.len().saturating_sub(HEADER) / SLOT) * SLOT);
    let mut mem = vec![0u64; len / 8];
    // SAFETY: plain bytes over a u64 buffer of `len` bytes.
    let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr().cast::<u8>(), len) };
    let n = data.len().min(len);
    bytes[..n].copy_from_slice(&data[..n]);
    // SAFETY: `mem` is `len` bytes, 8-aligned, and outlives the channel.
    let Some(rx) = (unsafe { Channel::open(mem.as_mut_ptr().cast(), len) }) else {
        return;
    };
    let mut out = Vec::new();
    let drained = rx.drain(&mut out);
    assert!(
        file_len(drained) <= len,
        "{drained} events from {len} bytes"
    );
    assert_eq!(rx.drain(&mut out), 0, "a drained channel has nothing more");
    let (_, _, _) = (rx.lost(), rx.state(), rx.error());
    let mut names = Names::default();
    for e in &out {
        if let Some(id) = names.take(e) {
            assert!(names.get(id).is_some_and(|s| s.len() <= 3 * MAX_NAME));
        }
    }
});
