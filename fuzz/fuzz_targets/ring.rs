//! The probe ring as the target may leave it: any header, lane counters, response area and
//! record bytes. The reader must refuse a header that does not fit, read each lane at most
//! once around per drain, and never read outside the mapping.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyframe_tracer::ring::{Ring, RECORD_SIZE};

/// Offset of the first record (the layout's fixed header and control pages).
const RECORDS: usize = 65536;

fuzz_target!(|data: &[u8]| {
    let Some((&[a, b], rest)) = data.split_first_chunk::<2>() else {
        return;
    };
    // The mapping's size: the fixed pages plus up to 511 records.
    let extra = usize::from(u16::from_le_bytes([a, b]) % 512) * RECORD_SIZE;
    let mut map = memmap2::MmapMut::map_anon(RECORDS + extra).expect("anonymous mapping");
    // The input is the header, lane counters and start of the response area; the records
    // repeat it.
    let head = rest.len().min(RECORDS);
    map[..head].copy_from_slice(&rest[..head]);
    if !rest.is_empty() {
        for chunk in map[RECORDS..].chunks_mut(rest.len()) {
            chunk.copy_from_slice(&rest[..chunk.len()]);
        }
    }
    let Ok(ring) = Ring::from_mapping(std::path::Path::new("fuzz"), map) else {
        return;
    };
    let mut out = Vec::new();
    let first = ring.drain(&mut out);
    assert!(
        first * RECORD_SIZE <= extra,
        "{first} records from {extra} bytes"
    );
    assert_eq!(ring.drain(&mut out), 0, "a drained ring has nothing more");
    let _ = ring.lost();
    let _ = ring.probe_state();
    for seq in [0, 1, u64::MAX] {
        if let Some(text) = ring.response(seq) {
            assert!(text.len() <= 3 * RECORDS, "a response longer than its page");
        }
    }
});
