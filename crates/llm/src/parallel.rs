//! Work split across cores, all of it on one pool: candle's rayon pool (a thread per core),
//! which runs each whole step ([`run`]), so the splits inside it are rayon joins: a chunk no
//! other thread has taken yet is run by the thread that made it. During a step the other
//! threads poll for work instead of sleeping (see [`run`]). Measured against candle's
//! barrier pool (persistent threads, the caller waits at a barrier for every worker to have
//! checked in): with another process busy on the machine, a worker descheduled for a time
//! slice held every product at the barrier, and a decode step took 13-165 ms instead of 7-10.

use modelmux_kernels::{ColumnChunks, ColumnsMut};
use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

/// Runs `f` (a whole step) on the pool; the calling thread waits. While `f` runs, the pool's
/// other threads stay awake, taking the step's work as it appears ([`keep_busy`]).
///
/// Why: a step is some 150 short parallel sections (every product, every attention) with
/// serial work between them. Left to rayon, a thread that finds nothing to do for a few tens
/// of microseconds goes to sleep, and the next section wakes it with a futex call, which the
/// step's own thread pays for and waits on. Profiled on 8 rows (a 2-core Xeon): 4% of the time
/// in the wake-up calls, as much again in the sleeps; kept awake, an 8-row step took 12.9-13.7
/// ms instead of 15.3-16.0 (3 alternating pairs of `bench_llm --scenario forward`). The
/// threads are awake only during a step, and yield the core to any other thread every few
/// microseconds of idling, as rayon's own idle loop does before it sleeps.
pub(crate) fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    candle_core::utils::with_threadpool(|| {
        let threads = rayon::current_num_threads();
        if threads == 1 {
            return f();
        }
        let done = AtomicBool::new(false);
        let mut out = None;
        rayon::scope(|s| {
            for _ in 1..threads {
                s.spawn(|_| keep_busy(&done));
            }
            // Set when `f` returns or unwinds: the scope waits for the helpers to see it.
            let _done = SetOnDrop(&done);
            out = Some(f());
        });
        out.expect("the scope ran the step")
    })
}

/// Sets its flag when dropped.
struct SetOnDrop<'a>(&'a AtomicBool);

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// Runs the pool's pending work until `done`: spinning while there is none, and yielding the
/// core to the OS every 64 empty looks.
fn keep_busy(done: &AtomicBool) {
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => idle = 0,
            _ => {
                idle += 1;
                if idle.is_multiple_of(64) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }
}

/// Threads of the pool the caller runs on.
pub(crate) fn threads() -> usize {
    rayon::current_num_threads()
}

/// Calls `f` as many as `count` times, from any threads of the pool; each call takes work
/// from a shared counter until there is none.
fn split(count: usize, f: impl Fn() + Sync) {
    (0..count).into_par_iter().for_each(|_| f());
}

/// Calls `f(i, chunk)` for every chunk `i` of `out` (`chunk` values each but the last), from
/// the pool's threads, each chunk once.
pub(crate) fn for_each_chunk(out: &mut [f32], chunk: usize, f: impl Fn(usize, &mut [f32]) + Sync) {
    if threads() == 1 || out.len() <= chunk {
        for (i, c) in out.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
        return;
    }
    // One row holding everything: its column chunks are contiguous slices.
    let len = out.len();
    let chunks = ColumnChunks::new(ColumnsMut::new(out, len), chunk);
    split(chunks.len(), || {
        while let Some(mut c) = chunks.next() {
            let i = c.columns().start / chunk;
            f(i, c.row_mut(0));
        }
    });
}

/// Calls `f(columns)` for column chunks of `out` (rows of `width` values; chunks of `chunk`
/// columns) from the pool's threads, each chunk once.
pub(crate) fn for_each_column_chunk(
    out: &mut [f32],
    width: usize,
    chunk: usize,
    f: impl Fn(ColumnsMut<'_>) + Sync,
) {
    if threads() == 1 || width <= chunk {
        f(ColumnsMut::new(out, width));
        return;
    }
    let chunks = ColumnChunks::new(ColumnsMut::new(out, width), chunk);
    split(chunks.len(), || {
        while let Some(c) = chunks.next() {
            f(c);
        }
    });
}

/// Runs `a` and `b`, on two of the pool's threads when there are several.
pub(crate) fn join<A: Send, B: Send>(
    a: impl FnOnce() -> A + Send,
    b: impl FnOnce() -> B + Send,
) -> (A, B) {
    if threads() == 1 {
        (a(), b())
    } else {
        rayon::join(a, b)
    }
}

/// Calls `f` on every item, on the pool's threads when there are several.
pub(crate) fn for_each<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    if threads() == 1 || items.len() < 2 {
        items.iter_mut().for_each(f);
    } else {
        items.par_iter_mut().for_each(&f);
    }
}
