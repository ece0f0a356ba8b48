//! The daemon's own heap.

/// Gives the heap's free pages back to the kernel (glibc's `malloc_trim`, every arena).
///
/// glibc keeps what a thread freed in that thread's arena, resident: a deep dive's million
/// events and timeline (built and freed on its writer thread) stayed in the daemon's RSS after
/// the capture (VmRSS 62 → 109 MB on vLLM), as did the kernel BTF parsed at start-up. Called after
/// such work, once each; trimming costs milliseconds.
pub fn release_free_heap() {
    // SAFETY: malloc_trim only walks and trims the allocator's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fixes glibc's allocation thresholds (mallopt(3)) so that what a capture frees leaves the
/// daemon's RSS.
///
/// By default glibc raises its mmap threshold to the size of each large block freed (up to
/// 32 MiB on 64-bit) and its trim threshold to twice that. After a few captures had freed
/// their event buffers, later buffers came from the threads' arenas, whose free tops
/// `malloc_trim` does not touch (it trims only the main arena's top; glibc malloc/malloc.c,
/// `mtrim`): attached to vLLM with a normal reference recorded every 10 minutes, the daemon
/// held 68-72 MB between captures, 47 MB of it in two thread arenas. Setting the thresholds
/// turns the adjustment off: blocks of 1 MiB or more are mapped and unmapped on free, and an
/// arena's free top past 1 MiB is given back when memory is freed, so each arena keeps at
/// most about 1 MiB (plus glibc's 128 KiB top pad) of free top resident (glibc
/// malloc/arena.c, `heap_trim`).
pub fn bound_free_heap() {
    // SAFETY: mallopt only sets the allocator's parameters, under its lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

/// What the heap holds, bytes (glibc's `mallinfo2`, every arena).
#[derive(Debug, Clone, Copy)]
pub struct Heap {
    /// Allocated: blocks in the arenas and blocks mapped on their own.
    pub in_use: u64,
    /// Free blocks the arenas hold (resident unless trimmed).
    pub free: u64,
}

/// The heap now. Takes each arena's lock in turn for a walk of its free lists: for a scrape,
/// not a hot path.
pub fn heap() -> Heap {
    // SAFETY: mallinfo2 only reads the allocator's own state, under its locks.
    let m = unsafe { libc::mallinfo2() };
    Heap {
        in_use: (m.uordblks + m.hblkhd) as u64,
        free: m.fordblks as u64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heap_counts_what_is_allocated() {
        let before = heap();
        let block = std::hint::black_box(vec![1u8; 8 << 20]);
        let during = heap();
        assert!(
            during.in_use >= before.in_use + (8 << 20),
            "{before:?} -> {during:?}"
        );
        drop(block);
        assert!(heap().in_use + (8 << 20) <= during.in_use + (1 << 20));
    }
}
