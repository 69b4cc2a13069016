//! Memory bandwidth with 4 KiB pages against transparent huge pages (2 MiB), over the access
//! pattern of single-stream decode: SmolLM2-135M's layer matrices (q/k/v, o, gate/up, down,
//! 4-bit) one after another, each split in halves between the threads. Both layouts are
//! mapped side by side and the passes alternate, so the machine's drift falls on both.
//! This is what `WeightArena` is for (see `pages.rs`).
//!
//! ```sh
//! cargo run --release -p modelmux-kernels --example bench_pages [THREADS]
//! ```
//!
//! Prints the median and quartiles of GB/s for each layout, split per matrix ("layers") and
//! as one contiguous stream per thread ("contiguous"). Linux on x86-64 only.

// A CPU loop timed by the wall clock; raw mappings and SIMD loads need `unsafe`.
#![allow(clippy::disallowed_types, unsafe_code)]

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn main() {
    linux::main();
}

#[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
fn main() {
    eprintln!("bench_pages runs on Linux x86-64 only");
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
mod linux {
    use std::arch::x86_64::*;
    use std::time::Instant;

    const HUGE_PAGE: usize = 2 << 20;
    /// Bytes of SmolLM2-135M's 4-bit layer matrices (20 bytes per 32 weights).
    const MATRICES: [usize; 4] = [345_600, 207_360, 1_105_920, 552_960];
    /// Twice the model's 30 layers: larger than any L3 here.
    const LAYERS: usize = 60;
    const ROUNDS: usize = 20;

    /// `len` bytes on a huge-page boundary, advised for huge pages or not, filled.
    fn mapping(len: usize, huge: bool) -> &'static [u8] {
        let padded = len.next_multiple_of(HUGE_PAGE) + HUGE_PAGE;
        // SAFETY: a fresh anonymous mapping, never unmapped (the process ends first); the
        // slice lies inside it, past the padding that aligns it.
        unsafe {
            let raw = libc::mmap(
                std::ptr::null_mut(),
                padded,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(raw, libc::MAP_FAILED, "mmap failed");
            let raw = raw.cast::<u8>();
            let start = raw.add((raw as usize).next_multiple_of(HUGE_PAGE) - raw as usize);
            let advice = if huge {
                libc::MADV_HUGEPAGE
            } else {
                libc::MADV_NOHUGEPAGE
            };
            libc::madvise(start.cast(), len.next_multiple_of(HUGE_PAGE), advice);
            let bytes = std::slice::from_raw_parts_mut(start, len);
            for (i, b) in bytes.iter_mut().enumerate() {
                *b = (i * 7) as u8;
            }
            bytes
        }
    }

    /// Reads every byte of `bytes` (whole 256-byte steps), prefetching 4 KiB ahead as the
    /// matrix kernels do.
    #[target_feature(enable = "avx2")]
    fn stream(bytes: &[u8]) -> u64 {
        let mut acc = _mm256_setzero_si256();
        let p = bytes.as_ptr();
        let mut i = 0;
        while i + 256 <= bytes.len() {
            for line in 0..4 {
                // A prefetch never faults, whatever the address.
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + 4096 + 64 * line).cast());
            }
            for j in 0..8 {
                // SAFETY: `i + 256 <= len`, so the 32 bytes at `i + 32 j` are inside.
                let v = unsafe { _mm256_loadu_si256(p.add(i + 32 * j).cast()) };
                acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, _mm256_setzero_si256()));
            }
            i += 256;
        }
        let mut out = [0u64; 4];
        // SAFETY: `out` is 32 bytes.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), acc) };
        out.iter().sum()
    }

    /// One pass: each of `threads` reads its share of every matrix, or (`contiguous`) one
    /// share of the whole.
    fn pass(bytes: &[u8], threads: usize, contiguous: bool) -> u64 {
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        if contiguous {
                            let share = (bytes.len() / threads) & !255;
                            // SAFETY: `main` checked the CPU has AVX2.
                            return unsafe { stream(&bytes[t * share..][..share]) };
                        }
                        let (mut at, mut sum) = (0, 0);
                        for _ in 0..LAYERS {
                            for size in MATRICES {
                                let share = (size / threads) & !255;
                                // SAFETY: as above.
                                sum += unsafe { stream(&bytes[at + t * share..][..share]) };
                                at += size;
                            }
                        }
                        sum
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().unwrap()).sum()
        })
    }

    pub(super) fn main() {
        assert!(is_x86_feature_detected!("avx2"), "needs AVX2");
        let threads: usize = std::env::args()
            .nth(1)
            .map(|a| a.parse().expect("THREADS is a number"))
            .unwrap_or(2);
        let len = LAYERS * MATRICES.iter().sum::<usize>();
        let layouts = [
            ("4k pages", mapping(len, false)),
            ("huge pages", mapping(len, true)),
        ];
        let smaps = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap_or_default();
        if let Some(line) = smaps.lines().find(|l| l.starts_with("AnonHugePages")) {
            println!("{line} (of {} MiB mapped per layout)", len >> 20);
        }
        for contiguous in [false, true] {
            let mut rates = vec![Vec::new(); layouts.len()];
            for _ in 0..ROUNDS {
                for (rates, (_, bytes)) in rates.iter_mut().zip(&layouts) {
                    let t = Instant::now();
                    std::hint::black_box(pass(bytes, threads, contiguous));
                    rates.push(len as f64 / t.elapsed().as_secs_f64() / 1e9);
                }
            }
            for (mut rates, (name, _)) in rates.into_iter().zip(&layouts) {
                rates.sort_by(f64::total_cmp);
                let q = |f: f64| rates[((rates.len() - 1) as f64 * f).round() as usize];
                println!(
                    "{threads} threads, {}, {name}: median {:.1} GB/s (quartiles {:.1}-{:.1})",
                    if contiguous { "contiguous" } else { "layers" },
                    q(0.5),
                    q(0.25),
                    q(0.75)
                );
            }
        }
    }
}
