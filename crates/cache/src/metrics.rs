//! Counters and histograms of one multiplexer, read as a [`MetricsSnapshot`].
//!
//! This module owns measurement only; it never exports. The serve layer reads snapshots at
//! scrape time and writes them in Prometheus format with its own labels (deployment, replica).
//! No global registry: each multiplexer has its own, so tests can assert exact values.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

const STRIPES: usize = 8;

/// A counter split over cache-line-sized cells, one picked per thread, so increments from
/// several threads on the hit path do not contend for one cache line.
#[derive(Default)]
pub(crate) struct StripedCounter {
    cells: [Padded; STRIPES],
}

#[derive(Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

fn stripe() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static STRIPE: Cell<usize> = Cell::new(NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES);
    }
    STRIPE.with(Cell::get)
}

impl StripedCounter {
    pub(crate) fn inc(&self) {
        self.cells[stripe()].0.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> u64 {
        self.cells.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }
}

/// Upper bounds, in seconds, of the load and unload histograms: from 1 ms (a cached read) to
/// 10 minutes (a large model over a slow link).
pub const DURATION_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 600.0,
];

/// A fixed-bucket histogram of durations, safe to observe from many threads at once.
///
/// ```
/// use std::time::Duration;
/// use modelmux_cache::DurationHistogram;
///
/// static BOUNDS: [f64; 3] = [0.001, 0.01, 0.1];
/// let h = DurationHistogram::new(&BOUNDS);
/// h.observe(Duration::from_millis(5));
/// assert_eq!(h.snapshot().buckets, vec![(0.001, 0), (0.01, 1), (0.1, 1)]);
/// ```
pub struct DurationHistogram {
    bounds: &'static [f64],
    buckets: Box<[AtomicU64]>,
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl Default for DurationHistogram {
    fn default() -> Self {
        Self::new(&DURATION_BUCKETS)
    }
}

impl DurationHistogram {
    /// A histogram with these bucket upper bounds, in seconds, ascending.
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds must ascend");
        Self {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(i) = self.bounds.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }

    /// Reads it, with cumulative buckets.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let buckets = self
            .bounds
            .iter()
            .zip(self.buckets.iter())
            .map(|(&le, n)| {
                cumulative += n.load(Ordering::Relaxed);
                (le, cumulative)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            count: self.count.load(Ordering::Relaxed),
            sum: Duration::from_nanos(self.sum_nanos.load(Ordering::Relaxed)),
        }
    }
}

/// A histogram as read at one moment, in Prometheus' shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, cumulative count)`, ascending; the `+Inf` bucket is `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Number of observations.
    pub count: u64,
    /// Sum of all observations.
    pub sum: Duration,
}

/// The live counters of one multiplexer.
#[derive(Default)]
pub(crate) struct Metrics {
    pub(crate) hits: StripedCounter,
    pub(crate) misses: StripedCounter,
    pub(crate) loads: AtomicU64,
    pub(crate) load_failures: AtomicU64,
    pub(crate) backoff_rejections: AtomicU64,
    pub(crate) capacity_exhausted: AtomicU64,
    pub(crate) loads_abandoned: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) unloads: AtomicU64,
    pub(crate) unload_failures: AtomicU64,
    pub(crate) load_duration: DurationHistogram,
    pub(crate) unload_duration: DurationHistogram,
}

impl Metrics {
    pub(crate) fn add(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self, gauges: Gauges) -> MetricsSnapshot {
        let hits = self.hits.get();
        let misses = self.misses.get();
        MetricsSnapshot {
            get_requests: hits + misses,
            hits,
            misses,
            loads: self.loads.load(Ordering::Relaxed),
            load_failures: self.load_failures.load(Ordering::Relaxed),
            backoff_rejections: self.backoff_rejections.load(Ordering::Relaxed),
            capacity_exhausted: self.capacity_exhausted.load(Ordering::Relaxed),
            loads_abandoned: self.loads_abandoned.load(Ordering::Relaxed),
            evictions: self.evictions.load(Ordering::Relaxed),
            unloads: self.unloads.load(Ordering::Relaxed),
            unload_failures: self.unload_failures.load(Ordering::Relaxed),
            load_duration: self.load_duration.snapshot(),
            unload_duration: self.unload_duration.snapshot(),
            gauges,
        }
    }
}

/// Point-in-time occupancy of a multiplexer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    /// Models loaded and servable.
    pub loaded: usize,
    /// Loads in progress (waiting for room, or running the loader).
    pub loading: usize,
    /// Evicted models whose unload has not finished (waiting for their last user, or unloading).
    pub draining: usize,
    /// Slots counted against `max_models`: loaded + reserved by loads + draining.
    pub used_slots: usize,
    /// Bytes counted against `max_bytes`: loaded + reserved by loads + draining.
    pub used_bytes: u64,
    /// Loaded models pinned against eviction.
    pub pinned: usize,
}

/// Everything a multiplexer has counted, read at one moment. Counters only ever grow.
///
/// The mapping to Ray Serve's metric names: `get_requests` is
/// `serve_multiplexed_get_model_requests_counter`, `loads` / `unloads` are
/// `serve_multiplexed_models_load_counter` / `_unload_counter`, `load_duration` /
/// `unload_duration` are `serve_multiplexed_model_load_latency_ms` / `_unload_latency_ms`
/// (in seconds here), and `gauges.loaded` is `serve_num_multiplexed_models`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSnapshot {
    /// Calls to `get` (hits + misses).
    pub get_requests: u64,
    /// Gets served from the cache without waiting.
    pub hits: u64,
    /// Gets that waited for a load (their own, or one already in progress).
    pub misses: u64,
    /// Loads started (the loader was called).
    pub loads: u64,
    /// Loads that failed (error, panic or timeout).
    pub load_failures: u64,
    /// Gets refused at once because the model failed recently.
    pub backoff_rejections: u64,
    /// Loads refused because no room could be made in time.
    pub capacity_exhausted: u64,
    /// Loads dropped before they started because nobody waited for them any more.
    pub loads_abandoned: u64,
    /// Models evicted to make room (not counting explicit evictions and shutdown).
    pub evictions: u64,
    /// Unload hooks that have run.
    pub unloads: u64,
    /// Unload hooks that returned an error or panicked.
    pub unload_failures: u64,
    /// Time spent in the loader, for successful loads.
    pub load_duration: HistogramSnapshot,
    /// Time spent in unload hooks.
    pub unload_duration: HistogramSnapshot,
    /// Occupancy at the moment of the snapshot.
    pub gauges: Gauges,
}

/// A duration in milliseconds rounded to two decimals, for log fields: `6.62`, not the
/// `6.618892000000001` a float product prints.
pub(crate) fn rounded_ms(d: std::time::Duration) -> f64 {
    (d.as_secs_f64() * 1e5).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn striped_counter_sums_all_threads() {
        let c = StripedCounter::default();
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..1000).for_each(|_| c.inc()));
            }
        });
        assert_eq!(c.get(), 4000);
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = DurationHistogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_millis(7));
        h.observe(Duration::from_secs(3600));
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets[0], (0.001, 1));
        assert_eq!(s.buckets[2], (0.01, 2));
        assert_eq!(s.buckets.last().unwrap().1, 2, "an hour is only in +Inf");
        assert_eq!(
            s.sum,
            Duration::from_micros(500) + Duration::from_millis(7) + Duration::from_secs(3600)
        );
    }
}
