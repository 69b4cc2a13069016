//! Where the weights live: [`WeightArena`] hands out the matrices' memory from large anonymous
//! mappings that Linux is asked to back with transparent huge pages (2 MiB), one matrix after
//! another in the order the model makes them.
//!
//! Why: single-stream decode streams every weight from memory once per token, and with 4 KiB
//! pages that is a TLB miss every 4 KiB; in a virtual machine each miss walks two page
//! tables. A heap allocation gets huge pages only where the kernel's THP mode is `always` and
//! the allocation covers whole aligned 2 MiB extents, which a layer's matrices (0.2-1.1 MiB
//! each for SmolLM2-135M) never do; one arena does, and it lays the matrices out in the
//! order a step reads them, so the kernels' prefetch past a matrix's end lands on the next
//! one. Measured on the Zen 3 VM this project runs on: `examples/bench_pages` (SmolLM2's
//! layer matrices, 2 threads) streams 3-10% faster with huge pages, and the engine's
//! single-stream decode ran 4-14% faster from the arena than from the heap (3 alternating
//! rounds of `bench_llm --scenario single`).
//!
//! Unsafe code here is of one kind: the mapping's memory is handed out as slices, each range
//! to exactly one [`Buffer`], which is then the only way to reach it (as `Vec`'s memory is
//! only reachable through its `Vec`), and the mapping is unmapped only after every buffer
//! cut from it is gone (each holds an `Arc` of it).
#![allow(unsafe_code)]

use std::ptr::NonNull;
use std::sync::Arc;

/// Bytes mapped at a time; a matrix larger than this gets a mapping of its own.
const MAPPING: usize = 64 << 20;
/// The huge page size the mappings are aligned to.
const HUGE_PAGE: usize = 2 << 20;
/// Every buffer starts on a cache line.
const ALIGN: usize = 64;

/// Memory for weight matrices: large mappings advised for transparent huge pages, cut into
/// buffers in the order they are asked for (see the module docs). Memory a buffer does not
/// use is never touched, so it costs address space, not memory.
#[derive(Debug, Default)]
pub struct WeightArena {
    /// The mapping being cut, and the bytes of it handed out.
    current: Option<(Arc<Mapping>, usize)>,
}

impl WeightArena {
    /// An arena that has mapped nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// `len` zeroed values. `T` must be plain data for which all-zero bytes are a value (the
    /// crate's `u16`s and cache lines).
    pub(crate) fn take<T: Zeroed>(&mut self, len: usize) -> Buffer<T> {
        let bytes = (len * std::mem::size_of::<T>()).next_multiple_of(ALIGN);
        if bytes == 0 {
            return Buffer::from_vec(Vec::new());
        }
        let fits = matches!(&self.current, Some((m, used)) if m.len - used >= bytes);
        if !fits {
            let size = bytes.max(MAPPING).next_multiple_of(HUGE_PAGE);
            match Mapping::new(size) {
                Some(mapping) => self.current = Some((Arc::new(mapping), 0)),
                // No mapping (not Unix, or the kernel refused): the heap, zeroed.
                None => return Buffer::from_vec(vec![T::ZERO; len]),
            }
        }
        let (mapping, used) = self.current.as_mut().expect("a mapping was just made");
        // SAFETY: `used + bytes <= mapping.len`, so the range lies inside the mapping; it was
        // never handed out before (`used` only grows), and it is aligned to `ALIGN`, which is
        // at least `T`'s alignment (the compile-time assertion below).
        let ptr = unsafe { NonNull::new_unchecked(mapping.ptr.as_ptr().add(*used)) }.cast::<T>();
        const { assert!(std::mem::align_of::<T>() <= ALIGN) };
        *used += bytes;
        Buffer {
            ptr,
            len,
            _owner: Owner::Mapped(Arc::clone(mapping)),
        }
    }
}

/// Gives the allocator's free memory back to the OS, where the allocator keeps it: glibc's
/// `malloc_trim`; elsewhere nothing. For the moments a model comes or goes (a load, a sleep),
/// not for a hot path: it walks every malloc arena.
///
/// Why: a model's file is read through transient buffers (the GGUF tensors before they are
/// converted into an arena). glibc raises its mmap threshold each time it frees a large
/// mapped block, so later large buffers come from its heaps and, once freed, stay with the
/// process. Measured with the LLM demo (2 replicas sharing one SmolLM2): 197 MB awake, 103 MB
/// asleep, and 35 MB more after each wake-up; trimmed after each load and release, 188 MB
/// awake and 75 MB asleep, cycle after cycle (lower than `MALLOC_MMAP_THRESHOLD_=65536` set
/// by hand: 176 and 81 MB).
pub fn release_free_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and only walks glibc's own free lists, under
    // their locks; it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Plain data whose all-zero bytes are a value: what a fresh mapping holds.
pub(crate) trait Zeroed: Copy {
    /// The all-zero value.
    const ZERO: Self;
}

impl Zeroed for u16 {
    const ZERO: Self = 0;
}

impl Zeroed for crate::panel::Line {
    const ZERO: Self = crate::panel::Line([0; 64]);
}

/// A fixed-length array of `T` that owns its memory: a heap allocation, or a range of an
/// arena's mapping that no other buffer shares.
pub(crate) struct Buffer<T> {
    ptr: NonNull<T>,
    len: usize,
    _owner: Owner<T>,
}

/// What keeps a buffer's memory alive.
enum Owner<T> {
    Heap(#[allow(dead_code)] Vec<T>),
    Mapped(#[allow(dead_code)] Arc<Mapping>),
}

// SAFETY: a `Buffer<T>` is the only way to reach its values (see the module docs), like a
// `Box<[T]>`, so it can move to or be shared with other threads when `T` can.
unsafe impl<T: Send> Send for Buffer<T> {}
// SAFETY: as for `Send`: shared access is `&[T]`.
unsafe impl<T: Sync> Sync for Buffer<T> {}

impl<T> Buffer<T> {
    /// A heap buffer holding `values`.
    pub(crate) fn from_vec(mut values: Vec<T>) -> Self {
        Self {
            // A `Vec`'s pointer stays put when the `Vec` moves.
            ptr: NonNull::new(values.as_mut_ptr()).expect("a Vec's pointer is never null"),
            len: values.len(),
            _owner: Owner::Heap(values),
        }
    }
}

impl<T> std::ops::Deref for Buffer<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points at `len` initialised values (a `Vec`'s, or zeroed mapping
        // memory, which `Zeroed` makes a value) that live as long as `_owner`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`; no other buffer reaches these values, and `&mut self` is
        // exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Clone> Clone for Buffer<T> {
    /// A copy on the heap.
    fn clone(&self) -> Self {
        Self::from_vec(self.to_vec())
    }
}

/// An anonymous private mapping, unmapped when dropped.
#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory, reached only through the buffers cut from it.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes (a multiple of [`HUGE_PAGE`]) of zeroed memory starting on a huge page,
    /// advised for huge pages; `None` when the kernel refuses.
    #[cfg(unix)]
    fn new(len: usize) -> Option<Self> {
        // Map one huge page more, then give back the unaligned head and tail.
        let padded = len + HUGE_PAGE;
        // SAFETY: a fresh anonymous mapping: no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                padded,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let raw = raw.cast::<u8>();
        // (Not `align_offset`, which may answer `usize::MAX`.)
        let head = (raw as usize).next_multiple_of(HUGE_PAGE) - raw as usize;
        // SAFETY: `head < HUGE_PAGE`, so `raw + head .. raw + head + len` lies inside the
        // `padded` bytes mapped; the head and tail unmapped are parts of that same mapping
        // nothing else refers to.
        unsafe {
            let start = raw.add(head);
            if head > 0 {
                libc::munmap(raw.cast(), head);
            }
            let tail = padded - head - len;
            if tail > 0 {
                libc::munmap(start.add(len).cast(), tail);
            }
            #[cfg(target_os = "linux")]
            libc::madvise(start.cast(), len, libc::MADV_HUGEPAGE);
            Some(Self {
                ptr: NonNull::new(start)?,
                len,
            })
        }
    }

    #[cfg(not(unix))]
    fn new(_len: usize) -> Option<Self> {
        None
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(unix)]
        // SAFETY: the range was mapped by `new` and every buffer cut from it is gone (each
        // held an `Arc` of this mapping).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_zeroed_aligned_and_apart() {
        let mut arena = WeightArena::new();
        let mut a: Buffer<u16> = arena.take(1000);
        let mut b: Buffer<crate::panel::Line> = arena.take(3);
        assert!(a.iter().all(|&v| v == 0) && b.iter().all(|l| l.0 == [0; 64]));
        assert_eq!((a.len(), b.len()), (1000, 3));
        assert_eq!(a.as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        a.fill(7);
        b[2].0[63] = 9;
        assert!(a.iter().all(|&v| v == 7), "writing b changed a");
        assert_eq!(b[2].0[63], 9);
        // In the order asked for, one after the other.
        assert!(b.as_ptr() as usize >= a.as_ptr() as usize + 2000);
        let copy = b.clone();
        drop(arena);
        drop(b);
        assert_eq!(
            copy[2].0[63], 9,
            "a clone outlives the arena and the original"
        );
        assert!(a.iter().all(|&v| v == 7), "a buffer outlives its arena");
    }

    #[test]
    fn a_buffer_larger_than_a_mapping_starts_a_mapping_of_its_own() {
        let mut arena = WeightArena::new();
        let _small: Buffer<u16> = arena.take(10);
        let large: Buffer<u16> = arena.take(MAPPING / 2 + 1);
        let after: Buffer<u16> = arena.take(10);
        assert_eq!(large.len(), MAPPING / 2 + 1);
        assert!(large.iter().all(|&v| v == 0));
        let (l, a) = (large.as_ptr() as usize, after.as_ptr() as usize);
        #[cfg(unix)]
        assert_eq!(l % HUGE_PAGE, 0, "a new mapping starts on a huge page");
        assert_eq!(
            a,
            l + (MAPPING + 2).next_multiple_of(ALIGN),
            "cut after the large one"
        );
    }

    /// The mapping holding `address`, as `/proc/self/smaps` describes it: its `VmFlags`.
    #[cfg(target_os = "linux")]
    fn vm_flags(address: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or_default();
            if let Some((start, end)) = range.split_once('-')
                && let (Ok(start), Ok(end)) = (
                    usize::from_str_radix(start, 16),
                    usize::from_str_radix(end, 16),
                )
            {
                inside = (start..end).contains(&address);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.trim().to_string();
            }
        }
        panic!("no mapping holds {address:#x}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn buffers_lie_in_memory_advised_for_huge_pages() {
        let mut arena = WeightArena::new();
        let buffer: Buffer<crate::panel::Line> = arena.take(1000);
        // `hg`: MADV_HUGEPAGE (see proc(5)).
        let flags = vm_flags(buffer.as_ptr() as usize);
        assert!(flags.split(' ').any(|f| f == "hg"), "VmFlags: {flags}");
        let heap = Buffer::from_vec(vec![0u16; 1000]);
        let flags = vm_flags(heap.as_ptr() as usize);
        assert!(
            !flags.split(' ').any(|f| f == "hg"),
            "the heap's VmFlags: {flags}"
        );
    }

    #[test]
    fn empty_buffers_take_nothing() {
        let mut arena = WeightArena::new();
        let empty: Buffer<u16> = arena.take(0);
        assert!(empty.is_empty());
        assert!(arena.current.is_none());
    }
}
