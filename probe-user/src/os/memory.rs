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
/// arena's free top past 4 MiB is trimmed when memory is freed.
pub fn bound_free_heap() {
    // SAFETY: mallopt only sets the allocator's parameters, under its lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 4 << 20);
    }
}
