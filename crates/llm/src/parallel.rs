//! Work split across cores, all of it on one pool: candle's rayon pool (a thread per core),
//! which runs each whole step ([`run`]), so the splits inside it are rayon joins: a chunk no
//! other thread has taken yet is run by the thread that made it. During a step the other
//! threads poll for work instead of sleeping (see [`run`]). Measured against candle's
//! barrier pool (persistent threads, the caller waits at a barrier for every worker to have
//! checked in): with another process busy on the machine, a worker descheduled for a time
//! slice held every product at the barrier, and a decode step took 13-165 ms instead of 7-10.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use modelmux_kernels::{ColumnChunks, ColumnsMut};
use rayon::prelude::*;
use tokio::time::Instant;

/// Runs `f` (a whole step) on the pool; the calling thread waits. While `f` runs, the pool's
/// other threads stay awake, taking the step's work as it appears ([`keep_busy`]).
///
/// Why: a step is some 150 short parallel sections (every product, every attention) with
/// serial work between them. Left to rayon, a thread that finds nothing to do for a few tens
/// of microseconds goes to sleep, and the next section wakes it with a futex call, which the
/// step's own thread pays for and waits on. Profiled on 8 rows (a 2-core Xeon): 4% of the time
/// in the wake-up calls, as much again in the sleeps; kept awake, an 8-row step took 12.9-13.7
/// ms instead of 15.3-16.0 (3 alternating pairs of `bench_llm --scenario forward`). The
/// threads are awake only during a step, yield the core to any other thread every few
/// microseconds of idling, and go back to sleeping after [`MAX_IDLE`] without work (so on a
/// machine where another process wants the cores they stop competing with the step).
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

/// How long a thread kept awake through a step may find no work before it goes back to
/// rayon's ordinary idling (sleeping until woken). Measured on 8 rows (2 cores): with a
/// process busy on one core, a helper that never gave up took its share of the cores from the
/// step's own thread, and 8 streams ran 10-25% slower than with rayon's sleeping threads;
/// with 100 us they ran at par (noisy: 317 and 359 against 280 and 379 tok/s), and on a quiet
/// machine 10% faster (590 and 610 against 536 and 548).
const MAX_IDLE: Duration = Duration::from_micros(100);

/// Runs the pool's pending work until `done`, spinning while there is none and yielding the
/// core to the OS every 64 empty looks; gives up after [`MAX_IDLE`] without work.
fn keep_busy(done: &AtomicBool) {
    let mut idle = 0u32;
    let mut since = None;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {
                idle = 0;
                since = None;
            }
            _ => {
                idle += 1;
                if idle.is_multiple_of(64) {
                    let now = Instant::now();
                    if now.duration_since(*since.get_or_insert(now)) > MAX_IDLE {
                        return;
                    }
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

/// Runs `f` on the pool, some time later, on whichever of its threads is free first; the
/// caller goes on at once. Called from a step, that is a thread kept awake beside it.
pub(crate) fn spawn(f: impl FnOnce() + Send + 'static) {
    rayon::spawn(f);
}

/// Calls `f` on every item, on the pool's threads when there are several.
pub(crate) fn for_each<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    if threads() == 1 || items.len() < 2 {
        items.iter_mut().for_each(f);
    } else {
        items.par_iter_mut().for_each(&f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A step's worth of split work: every chunk of a buffer filled with its index, then
    /// checked.
    fn split_step(len: usize, chunk: usize) -> bool {
        let mut out = vec![-1.0f32; len];
        for_each_chunk(&mut out, chunk, |i, c| c.fill(i as f32));
        let (a, b) = join(|| out.len(), || out.iter().sum::<f32>());
        (out.chunks(chunk).enumerate()).all(|(i, c)| c.iter().all(|&v| v == i as f32))
            && a == len
            && b >= 0.0
    }

    #[test]
    fn steps_run_their_splits_and_return_their_value() {
        for round in 0..200 {
            assert!(run(|| split_step(4096 + round, 64)), "round {round}");
        }
        assert_eq!(run(|| 7), 7);
    }

    /// Several engines' threads running steps at once on the one pool (each step keeps the
    /// pool's other threads awake, which then run the other steps' work too): every step
    /// finishes with its own results, and none waits for ever.
    #[test]
    fn steps_from_several_threads_at_once_all_finish() {
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    s.spawn(move || (0..100).all(|r| run(|| split_step(2048 + t * 7 + r, 32))))
                })
                .collect();
            for h in handles {
                assert!(h.join().expect("no panic"));
            }
        });
    }

    /// A step that panics unwinds to its caller, and the pool runs the next step.
    #[test]
    fn a_step_that_panics_unwinds_and_the_pool_goes_on() {
        let result = std::panic::catch_unwind(|| {
            run(|| {
                assert!(split_step(4096, 64));
                panic!("a step failed");
            })
        });
        assert!(result.is_err());
        assert!(run(|| split_step(4096, 64)));
    }
}
