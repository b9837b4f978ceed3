//! An allocator that keeps hostile array lengths from aborting the process.
//!
//! The codec decodes an array by first reserving capacity for the element
//! count read off the wire (up to 2^32 elements), before it has read a
//! single element. With the system allocator a large count makes the
//! kernel refuse the mapping and Rust aborts the process, taking every
//! connection with it. [`GuardedAlloc`] serves allocations of at least
//! [`HUGE_BYTES`] from anonymous mappings made with `MAP_NORESERVE`: the
//! kernel grants the address range without committing memory, the decoder
//! fails on the missing bytes after touching a page or two, and the mapping
//! is returned. Legitimate allocations of this size do not occur in Keel
//! (request frames are capped by `socket.request.max.bytes`).
//!
//! With `vm.overcommit_memory = 2` the kernel still refuses such mappings;
//! that host setting is reported by the operator tooling rather than
//! worked around here.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::{null_mut, NonNull};

use rustix::mm::{mmap_anonymous, munmap, MapFlags, ProtFlags};

/// Allocations at least this large are served from reserved-on-touch
/// mappings.
pub const HUGE_BYTES: usize = 1 << 30;

/// Mappings are page aligned; larger alignments go to the system allocator.
const PAGE_BYTES: usize = 4096;

/// The global allocator of Keel's binaries (see the module docs).
pub struct GuardedAlloc;

fn is_huge(layout: &Layout) -> bool {
    layout.size() >= HUGE_BYTES && layout.align() <= PAGE_BYTES
}

// SAFETY: every method either forwards to `System` with the same layout, or
// (for huge layouts, decided by `is_huge` on the same layout in `alloc` and
// `dealloc`) maps and unmaps exactly `layout.size()` bytes. Anonymous
// mappings are page aligned (satisfying any align <= PAGE_BYTES) and zeroed.
unsafe impl GlobalAlloc for GuardedAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !is_huge(&layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc(layout) };
        }
        let flags = MapFlags::PRIVATE | MapFlags::NORESERVE;
        // SAFETY: a fresh anonymous mapping aliases nothing.
        match unsafe {
            mmap_anonymous(
                null_mut(),
                layout.size(),
                ProtFlags::READ | ProtFlags::WRITE,
                flags,
            )
        } {
            Ok(p) => p.cast(),
            Err(_) => null_mut(),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if is_huge(&layout) {
            // SAFETY: anonymous mappings are zero-filled.
            return unsafe { self.alloc(layout) };
        }
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if is_huge(&layout) {
            // SAFETY: `ptr` came from `alloc` with this layout, so it is a
            // mapping of exactly `layout.size()` bytes.
            let _ = unsafe { munmap(ptr.cast(), layout.size()) };
        } else {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return null_mut();
        };
        if !is_huge(&layout) && !is_huge(&new_layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: `new_layout` has a non-zero size (>= the smaller of a huge
        // size and the caller's non-zero new size).
        let new = unsafe { self.alloc(new_layout) };
        if let Some(dst) = NonNull::new(new) {
            // SAFETY: both regions are valid for the copied length and are
            // distinct allocations.
            unsafe { std::ptr::copy_nonoverlapping(ptr, dst.as_ptr(), layout.size().min(new_size)) };
            // SAFETY: `ptr` was allocated by this allocator with `layout`.
            unsafe { self.dealloc(ptr, layout) };
        }
        new
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_reservations_cost_only_touched_pages() {
        // 64 TiB of address space: far beyond RAM, granted lazily.
        let layout = Layout::from_size_align(64 << 40, 8).unwrap();
        // SAFETY: non-zero size; freed with the same layout below.
        let p = unsafe { GuardedAlloc.alloc(layout) };
        assert!(!p.is_null());
        // SAFETY: within the mapping.
        unsafe {
            p.write(7);
            assert_eq!(p.read(), 7);
            GuardedAlloc.dealloc(p, layout);
        }
    }
}
