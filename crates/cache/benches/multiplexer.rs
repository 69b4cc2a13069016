//! Benchmarks of the model cache: the cost of the cache's two paths.
//!
//! - `hit/*`: `get` of a loaded model and dropping its guard, polled once (no runtime in the
//!   loop), from one thread and from two threads at once (same model, and one model each).
//!   `locked_cache/*` runs the same pattern against the obvious lock-based design with the
//!   same semantics (a `Mutex<HashMap>` whose entries carry a pin count and an LRU tick, both
//!   updated under the lock on get and on release), so the two compare as a ratio from one run.
//!   `bare_mutex_map/*` is a floor: a `Mutex<HashMap<String, Arc<M>>>` with no pins and no LRU.
//! - `miss/zero_cost_loader`: a get that loads (and, at capacity 1, evicts and unloads the
//!   previous model), with a loader that does nothing: the cache's own overhead per load.
//!
//! Run: `cargo bench -p modelmux-cache --bench multiplexer`

use std::collections::HashMap;
use std::future::Future;
use std::hint::black_box;
use std::ops::Deref;
use std::pin::pin;
use std::sync::{Arc, Barrier};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use modelmux_cache::{Model, ModelGuard, ModelId, Multiplexer};

struct Weights(#[allow(dead_code)] [u8; 64]);
impl Model for Weights {}

fn loader(_id: ModelId) -> std::future::Ready<Result<Weights, std::io::Error>> {
    std::future::ready(Ok(Weights([0; 64])))
}

/// Polls `get` once: on a hit it is ready at once, with no runtime involved.
fn hit(mux: &Multiplexer<Weights>, id: &str) -> ModelGuard<Weights> {
    let mut cx = Context::from_waker(Waker::noop());
    match pin!(mux.get(id)).poll(&mut cx) {
        Poll::Ready(Ok(guard)) => guard,
        _ => panic!("'{id}' was expected to be loaded"),
    }
}

/// The lock-based design: what a cache with pins and LRU looks like behind one mutex.
#[derive(Default)]
struct LockedCache {
    inner: parking_lot::Mutex<(u64, HashMap<String, LockedEntry>)>,
}

struct LockedEntry {
    model: Arc<Weights>,
    in_use: usize,
    tick: u64,
}

struct LockedGuard<'a> {
    cache: &'a LockedCache,
    id: &'a str,
    model: Arc<Weights>,
}

impl LockedCache {
    fn insert(&self, id: &str) {
        let model = Arc::new(Weights([0; 64]));
        let entry = LockedEntry {
            model,
            in_use: 0,
            tick: 0,
        };
        self.inner.lock().1.insert(id.to_string(), entry);
    }

    fn get<'a>(&'a self, id: &'a str) -> LockedGuard<'a> {
        let mut inner = self.inner.lock();
        inner.0 += 1;
        let tick = inner.0;
        let entry = inner.1.get_mut(id).expect("loaded");
        entry.in_use += 1;
        entry.tick = tick;
        LockedGuard {
            cache: self,
            id,
            model: entry.model.clone(),
        }
    }
}

impl Deref for LockedGuard<'_> {
    type Target = Weights;
    fn deref(&self) -> &Weights {
        &self.model
    }
}

impl Drop for LockedGuard<'_> {
    fn drop(&mut self) {
        self.cache
            .inner
            .lock()
            .1
            .get_mut(self.id)
            .expect("loaded")
            .in_use -= 1;
    }
}

/// Runs `op` `iters` times on each of two threads at once; returns the wall time, so the
/// reported time is per operation per thread under contention.
fn two_threads(iters: u64, op: impl Fn(usize) + Sync) -> Duration {
    let barrier = Barrier::new(2);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|t| {
                let (barrier, op) = (&barrier, &op);
                s.spawn(move || {
                    barrier.wait();
                    #[allow(clippy::disallowed_types)] // a benchmark measures wall time
                    let start = std::time::Instant::now();
                    for _ in 0..iters {
                        op(t);
                    }
                    start.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .max()
            .unwrap()
    })
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mux = {
        let _enter = rt.enter();
        Multiplexer::builder().max_models(8).build(loader)
    };
    rt.block_on(async {
        for id in ["hot", "t0", "t1"] {
            mux.preload(id).await.unwrap();
        }
    });
    let mutex_map: parking_lot::Mutex<HashMap<String, Arc<Weights>>> = parking_lot::Mutex::new(
        ["hot", "t0", "t1"]
            .into_iter()
            .map(|id| (id.to_string(), Arc::new(Weights([0; 64]))))
            .collect(),
    );
    let mutex_get = |id: &str| mutex_map.lock().get(id).cloned().unwrap();
    let locked = LockedCache::default();
    for id in ["hot", "t0", "t1"] {
        locked.insert(id);
    }
    let per_thread = ["t0", "t1"];

    let mut g = c.benchmark_group("hit");
    g.bench_function("one_thread", |b| {
        b.iter(|| drop(black_box(hit(&mux, black_box("hot")))))
    });
    g.bench_function("two_threads_same_model", |b| {
        b.iter_custom(|iters| two_threads(iters, |_| drop(black_box(hit(&mux, "hot")))))
    });
    g.bench_function("two_threads_one_model_each", |b| {
        b.iter_custom(|iters| two_threads(iters, |t| drop(black_box(hit(&mux, per_thread[t])))))
    });
    g.finish();

    let mut g = c.benchmark_group("locked_cache");
    g.bench_function("one_thread", |b| {
        b.iter(|| drop(black_box(locked.get(black_box("hot")))))
    });
    g.bench_function("two_threads_same_model", |b| {
        b.iter_custom(|iters| two_threads(iters, |_| drop(black_box(locked.get("hot")))))
    });
    g.bench_function("two_threads_one_model_each", |b| {
        b.iter_custom(|iters| two_threads(iters, |t| drop(black_box(locked.get(per_thread[t])))))
    });
    g.finish();

    let mut g = c.benchmark_group("bare_mutex_map");
    g.bench_function("one_thread", |b| {
        b.iter(|| drop(black_box(mutex_get(black_box("hot")))))
    });
    g.bench_function("two_threads_same_model", |b| {
        b.iter_custom(|iters| two_threads(iters, |_| drop(black_box(mutex_get("hot")))))
    });
    g.bench_function("two_threads_one_model_each", |b| {
        b.iter_custom(|iters| two_threads(iters, |t| drop(black_box(mutex_get(per_thread[t])))))
    });
    g.finish();

    let mut g = c.benchmark_group("miss");
    let small = {
        let _enter = rt.enter();
        Multiplexer::builder().max_models(1).build(loader)
    };
    g.bench_function("zero_cost_loader", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = tokio::time::Instant::now();
                for i in 0..iters {
                    // Alternating ids at capacity 1: every get loads, evicts and unloads.
                    let id = if i % 2 == 0 { "a" } else { "b" };
                    drop(black_box(small.get(id).await.unwrap()));
                }
                start.elapsed()
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = multiplexer;
    config = Criterion::default().measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = benches
}
criterion_main!(multiplexer);
