//! The command line's global allocator: the system's, except that allocations of 2 MiB or
//! more (the arenas: parameters, gradients, AdamW moments, activations) are 2 MiB-aligned
//! and advised to the kernel as transparent huge pages (`madvise(MADV_HUGEPAGE)` on Linux,
//! whose default THP mode, `madvise`, backs nothing else with them). A training step walks
//! tens of MiB of arenas, far more than the TLB covers in 4 KiB pages (docs/performance.md,
//! "Kernel choices").

use std::alloc::{GlobalAlloc, Layout, System};

/// A transparent huge page's size on x86-64 and most 64-bit Linux targets.
const HUGE_PAGE: usize = 2 << 20;

/// The global allocator of `alpha-native` (see the module docs).
pub struct HugePageAlloc;

/// The layout a large allocation is made with: whole huge pages, aligned to one; `None` for
/// small ones (or where rounding up overflows), which go to the system allocator as asked.
fn huge_layout(layout: Layout) -> Option<Layout> {
    if layout.size() < HUGE_PAGE {
        return None;
    }
    Layout::from_size_align(layout.size().checked_next_multiple_of(HUGE_PAGE)?, layout.align().max(HUGE_PAGE)).ok()
}

/// Asks for huge pages on `len` bytes at `ptr` before they are first touched. Only a hint:
/// where the kernel declines (THP `never`, or not Linux) the memory stays as it is.
///
/// # Safety
/// `ptr..ptr + len` must be a mapping this process owns.
unsafe fn advise_huge_pages(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        // From the C library std already links; Linux's value of the advice.
        extern "C" {
            fn madvise(addr: *mut core::ffi::c_void, len: usize, advice: core::ffi::c_int) -> core::ffi::c_int;
        }
        const MADV_HUGEPAGE: core::ffi::c_int = 14;
        // SAFETY: the range is the caller's mapping; the advice changes no contents.
        unsafe { madvise(ptr.cast(), len, MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

// SAFETY: every block comes from `System` with the layout it is later freed with
// (`huge_layout` is a function of the caller's layout), at least as large and as aligned as
// asked.
unsafe impl GlobalAlloc for HugePageAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY (both): forwarded with a layout of non-zero size.
        match huge_layout(layout) {
            None => unsafe { System.alloc(layout) },
            Some(huge) => unsafe {
                let ptr = System.alloc(huge);
                if !ptr.is_null() {
                    advise_huge_pages(ptr, huge.size());
                }
                ptr
            },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if huge_layout(layout).is_none() {
            // SAFETY: forwarded.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // Advised before the zeroing touches the pages, so that they fault in huge.
        // SAFETY: `alloc` returns `layout.size()` writable bytes or null.
        unsafe {
            let ptr = self.alloc(layout);
            if !ptr.is_null() {
                ptr.write_bytes(0, layout.size());
            }
            ptr
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: allocated by `alloc` with this layout, so with its `huge_layout`.
        unsafe { System.dealloc(ptr, huge_layout(layout).unwrap_or(layout)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's layout is valid, so is one with the new size and its alignment.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        if huge_layout(layout).is_none() && huge_layout(new_layout).is_none() {
            // SAFETY: forwarded: both blocks are the system's own.
            return unsafe { System.realloc(ptr, layout, new_size) };
        }
        // SAFETY: a new block, the old contents copied (as much as both hold), the old freed.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_layouts_are_kept_and_large_ones_rounded_to_huge_pages() {
        let small = Layout::from_size_align(HUGE_PAGE - 1, 8).unwrap();
        assert_eq!(huge_layout(small), None);
        let large = huge_layout(Layout::from_size_align(HUGE_PAGE + 1, 4).unwrap()).unwrap();
        assert_eq!((large.size(), large.align()), (2 * HUGE_PAGE, HUGE_PAGE));
        assert_eq!(huge_layout(Layout::from_size_align(isize::MAX as usize - 63, 64).unwrap()), None);
    }

    #[test]
    fn blocks_hold_their_contents_through_every_path() {
        let a = HugePageAlloc;
        let layout = |size| Layout::from_size_align(size, 8).unwrap();
        // Every 4093rd byte holds its index (mod 256). SAFETY (both): called on blocks of at
        // least `size` bytes.
        let fill = |p: *mut u8, size: usize| (0..size).step_by(4093).for_each(|i| unsafe { *p.add(i) = i as u8 });
        let holds = |p: *const u8, size: usize| (0..size).step_by(4093).all(|i| unsafe { *p.add(i) } == i as u8);
        // SAFETY: every block is used within its size and freed once, with its layout.
        unsafe {
            for size in [64, HUGE_PAGE - 8, HUGE_PAGE, 3 * HUGE_PAGE + 8] {
                let mut p = a.alloc_zeroed(layout(size));
                assert!(!p.is_null() && (0..size).step_by(4093).all(|i| *p.add(i) == 0));
                if size >= HUGE_PAGE {
                    assert_eq!(p as usize % HUGE_PAGE, 0, "large blocks are huge-page aligned");
                }
                // Grown and shrunk, across the threshold where the size is near it.
                for new_size in [size * 2, size / 3] {
                    fill(p, size);
                    let q = a.realloc(p, layout(size), new_size);
                    assert!(!q.is_null() && holds(q, size.min(new_size)), "{size} -> {new_size}");
                    a.dealloc(q, layout(new_size));
                    p = a.alloc(layout(size));
                }
                a.dealloc(p, layout(size));
            }
        }
    }
}
