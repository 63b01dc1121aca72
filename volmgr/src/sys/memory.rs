//! Giving freed heap memory back to the kernel.
//!
//! The safety nets (the periodic resync parsing 10,000 mountinfo lines, the
//! manifests rescan listing 10,000 files) and the eBPF loader allocate
//! megabytes for a moment. glibc keeps what they free in the arena of the
//! thread that freed it, so without a trim an idle agent with 10,000 volumes
//! stayed 5-7 MB larger after its first resync (BENCHMARKS.md).

/// Returns the free pages of every malloc arena to the kernel
/// (`malloc_trim(0)`). It walks every arena under its lock, so call it
/// after a large transient allocation, not on a hot path.
pub fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim has no preconditions; it only walks and trims
    // glibc's own arenas, under their locks.
    unsafe {
        libc::malloc_trim(0);
    }
}
