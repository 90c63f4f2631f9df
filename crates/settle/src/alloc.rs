//! The settle binary's allocator: mimalloc, asked for an alignment only when
//! a layout needs more than every mimalloc block has.
//!
//! The `mimalloc` crate sends every allocation through `mi_malloc_aligned`.
//! mimalloc 3 serves that from its plain path only for power-of-two block
//! sizes; any other size, whenever the thread's page had no free block
//! left, was over-allocated by the alignment and its page marked as holding
//! interior pointers. The writer's pages rarely have a free block (other
//! threads free what it allocates), so about a quarter of its allocations
//! took that path (the profile is in docs/performance.md, under
//! `mi_malloc_aligned`).

#![allow(unsafe_code)] // a GlobalAlloc is unsafe by definition

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// Every mimalloc block is aligned to at least this much: its size classes
/// are multiples of a word, laid out from word-aligned page starts.
const WORD: usize = std::mem::size_of::<usize>();

/// mimalloc as the global allocator.
pub struct Mimalloc;

// SAFETY: each method hands mimalloc a request of the layout's size, and
// either needs no alignment beyond `WORD` (which every mimalloc block has)
// or asks mimalloc for it; memory goes back through `mi_free`/`mi_realloc*`,
// which accept any block mimalloc gave out.
unsafe impl GlobalAlloc for Mimalloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_malloc(layout.size()).cast()
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_zalloc(layout.size()).cast()
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()).cast()
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator.
        unsafe { mi::mi_free(ptr.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_realloc(ptr.cast::<c_void>(), new_size).cast()
            } else {
                mi::mi_realloc_aligned(ptr.cast::<c_void>(), new_size, layout.align()).cast()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size and alignment comes back aligned, writable whole, and
    /// keeps its bytes through a reallocation (the tests run on this
    /// allocator too, as the global one).
    #[test]
    fn blocks_are_aligned_and_keep_their_bytes() {
        let a = Mimalloc;
        for align in [1, 2, 4, 8, 16, 32, 64, 128, 4096] {
            for size in [
                1, 3, 7, 8, 9, 15, 16, 17, 24, 40, 100, 224, 1000, 1025, 5000, 70_000,
            ] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero size; freed below with the same layout.
                unsafe {
                    let p = a.alloc(layout);
                    assert!(!p.is_null());
                    assert_eq!(p as usize % align, 0, "size {size} align {align}");
                    std::ptr::write_bytes(p, 0xA5, size);
                    let z = a.alloc_zeroed(layout);
                    assert_eq!(z as usize % align, 0, "zeroed: size {size} align {align}");
                    assert!(std::slice::from_raw_parts(z, size).iter().all(|&b| b == 0));
                    a.dealloc(z, layout);
                    let q = a.realloc(p, layout, size * 3);
                    assert_eq!(q as usize % align, 0, "realloc: size {size} align {align}");
                    assert!(
                        std::slice::from_raw_parts(q, size)
                            .iter()
                            .all(|&b| b == 0xA5)
                    );
                    a.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                }
            }
        }
    }
}
