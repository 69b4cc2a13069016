//! Work split across cores, all of it on one pool: candle's rayon pool (a thread per core),
//! which runs each whole step ([`run`]), so the splits inside it are rayon joins: a chunk no
//! other thread has taken yet is run by the thread that made it. Measured against candle's
//! barrier pool (persistent threads, the caller waits at a barrier for every worker to have
//! checked in): with another process busy on the machine, a worker descheduled for a time
//! slice held every product at the barrier, and a decode step took 13-165 ms instead of 7-10.

use modelmux_kernels::{ColumnChunks, ColumnsMut};
use rayon::prelude::*;

/// Runs `f` (a whole step) on the pool; the calling thread waits.
pub(crate) fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    candle_core::utils::with_threadpool(f)
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

/// Calls `f` on every item, on the pool's threads when there are several.
pub(crate) fn for_each<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    if threads() == 1 || items.len() < 2 {
        items.iter_mut().for_each(f);
    } else {
        items.par_iter_mut().for_each(&f);
    }
}
