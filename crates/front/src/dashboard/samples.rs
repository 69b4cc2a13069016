//! The dashboard's memory: once a second, each deployment's counters summed over this
//! node's replicas (requests by outcome, latency buckets, cache lookups, loads, evictions,
//! and an LLM engine's token counts and gauges), kept for the last five minutes in a ring,
//! and turned into rates and percentiles over each second when the page asks. The page works
//! without Prometheus; sampling starts when the dashboard is first read, so a server nobody
//! watches pays nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use modelmux_cache::HistogramSnapshot;
use modelmux_serve::{MetricFamily, MetricValue, MetricsReport};
use parking_lot::Mutex;
use serde_json::{Value, json};

use crate::state::FrontState;

/// Time between samples.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);
/// Samples kept per deployment (five minutes).
const KEPT: usize = 301;

/// Cumulative histogram buckets (upper bound in seconds, cumulative count), summed.
#[derive(Clone, Default)]
struct Buckets {
    bounds: Vec<(f64, u64)>,
    count: u64,
}

impl Buckets {
    fn add(&mut self, h: &HistogramSnapshot) {
        if self.bounds.is_empty() {
            self.bounds = h.buckets.clone();
        } else if self.bounds.len() == h.buckets.len() {
            for (mine, theirs) in self.bounds.iter_mut().zip(&h.buckets) {
                mine.1 += theirs.1;
            }
        } else {
            // Another layout: not summable; counted, not placed.
        }
        self.count += h.count;
    }

    /// The `q` quantile (in milliseconds) of the observations between `earlier` and `self`,
    /// interpolated within its bucket as Prometheus' `histogram_quantile` does; `None`
    /// without observations.
    fn quantile_since(&self, earlier: &Buckets, q: f64) -> Option<f64> {
        let total = self.count.checked_sub(earlier.count).filter(|n| *n > 0)?;
        let rank = q * total as f64;
        let mut below = (0.0, 0u64);
        for (i, &(bound, cumulative)) in self.bounds.iter().enumerate() {
            let before = earlier.bounds.get(i).map_or(0, |b| b.1);
            let n = cumulative.saturating_sub(before);
            if n as f64 >= rank {
                let inside = (n - below.1) as f64;
                let fraction = if inside > 0.0 {
                    (rank - below.1 as f64) / inside
                } else {
                    1.0
                };
                return Some(1e3 * (below.0 + (bound - below.0) * fraction.clamp(0.0, 1.0)));
            }
            below = (bound, n);
        }
        // In the +Inf bucket: the largest finite bound is all that is known.
        Some(1e3 * below.0)
    }
}

/// An LLM engine's counters and gauges (the `vllm:*` families), summed over replicas.
#[derive(Clone, Default)]
struct LlmPoint {
    generation_tokens: f64,
    prompt_tokens: f64,
    ttft: Buckets,
    running: f64,
    waiting: f64,
    kv_usage_sum: f64,
    kv_replicas: usize,
}

/// One deployment at one instant.
#[derive(Clone, Default)]
struct Point {
    at: f64,
    requests: u64,
    errors: u64,
    duration: Buckets,
    lookups: u64,
    hits: u64,
    loads: u64,
    evictions: u64,
    loaded: usize,
    ongoing: usize,
    queued: usize,
    llm: Option<LlmPoint>,
}

/// The rings of every deployment (`(app, deployment)`), oldest sample first.
#[derive(Default)]
pub(crate) struct Samples {
    rings: Mutex<HashMap<(String, String), VecDeque<Point>>>,
    started: std::sync::OnceLock<()>,
}

impl Samples {
    /// Starts sampling `state` every [`INTERVAL`] (once; the task ends with the server).
    pub(crate) fn start(&self, state: &Arc<FrontState>) {
        self.started.get_or_init(|| {
            let weak: Weak<FrontState> = Arc::downgrade(state);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(INTERVAL);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(state) = weak.upgrade() else { return };
                    let report = state.controller.metrics();
                    state.dashboard.record(&report);
                }
            });
        });
    }

    /// Adds a sample of every deployment in `report`.
    fn record(&self, report: &MetricsReport) {
        let at = unix_seconds();
        let mut points: HashMap<(String, String), Point> = HashMap::new();
        for q in &report.queues {
            let point = points
                .entry((q.app.to_string(), q.deployment.clone()))
                .or_default();
            point.queued = q.queued;
        }
        for r in &report.replicas {
            let key = (r.app.to_string(), r.deployment.to_string());
            let point = points.entry(key).or_default();
            point.requests += r.requests_by_class.iter().sum::<u64>();
            point.errors += r.requests_by_class[4];
            point.duration.add(&r.duration);
            point.ongoing += r.ongoing;
            if let Some(cache) = &r.cache {
                point.lookups += cache.get_requests;
                point.hits += cache.hits;
                point.loads += cache.loads;
                point.evictions += cache.evictions;
                point.loaded += cache.gauges.loaded;
            }
            add_llm(point, &r.families);
        }
        let mut rings = self.rings.lock();
        rings.retain(|key, _| points.contains_key(key));
        for (key, mut point) in points {
            point.at = at;
            let ring = rings.entry(key).or_default();
            if ring.len() == KEPT {
                ring.pop_front();
            }
            ring.push_back(point);
        }
    }

    /// Every deployment's series: rates and percentiles over each interval between samples.
    pub(crate) fn series(&self) -> Vec<Value> {
        let rings = self.rings.lock();
        let mut keys: Vec<&(String, String)> = rings.keys().collect();
        keys.sort();
        keys.into_iter()
            .map(|key| series_of(&key.0, &key.1, &rings[key]))
            .collect()
    }
}

/// Adds a replica's `vllm:*` families (an LLM engine's) to `point`.
fn add_llm(point: &mut Point, families: &[MetricFamily]) {
    if !families.iter().any(|f| f.name.starts_with("vllm:")) {
        return;
    }
    let number = |f: &MetricFamily| -> f64 {
        f.samples
            .iter()
            .map(|s| match &s.value {
                MetricValue::Number(n) => *n,
                MetricValue::Histogram(_) => 0.0,
            })
            .sum()
    };
    let llm = point.llm.get_or_insert_with(LlmPoint::default);
    for family in families {
        match family.name {
            "vllm:generation_tokens_total" => llm.generation_tokens += number(family),
            "vllm:prompt_tokens_total" => llm.prompt_tokens += number(family),
            "vllm:num_requests_running" => llm.running += number(family),
            "vllm:num_requests_waiting" => llm.waiting += number(family),
            "vllm:kv_cache_usage_perc" => {
                llm.kv_usage_sum += number(family);
                llm.kv_replicas += 1;
            }
            "vllm:time_to_first_token_seconds" => {
                for s in &family.samples {
                    if let MetricValue::Histogram(h) = &s.value {
                        llm.ttft.add(h);
                    }
                }
            }
            _ => {}
        }
    }
}

fn unix_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Rounds for the page: 3 decimals are plenty and keep the JSON small.
fn round(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1e3).round() / 1e3)
    } else {
        Value::Null
    }
}

fn series_of(app: &str, deployment: &str, ring: &VecDeque<Point>) -> Value {
    let pairs: Vec<(&Point, &Point)> = ring.iter().zip(ring.iter().skip(1)).collect();
    let per = |f: &dyn Fn(&Point, &Point, f64) -> Value| -> Vec<Value> {
        pairs
            .iter()
            .map(|(a, b)| f(a, b, (b.at - a.at).max(1e-3)))
            .collect()
    };
    let rate = |n: u64, dt: f64| round(n as f64 / dt);
    let ratio = |part: u64, whole: u64| {
        if whole == 0 {
            Value::Null
        } else {
            round(part as f64 / whole as f64)
        }
    };
    let quantile = |q: f64| {
        per(&|a, b, _| {
            b.duration
                .quantile_since(&a.duration, q)
                .map_or(Value::Null, round)
        })
    };
    let llm = ring.back().and_then(|p| p.llm.as_ref()).map(|_| {
        let get = |p: &Point| p.llm.clone().unwrap_or_default();
        json!({
            "generation_tokens_per_second": per(&|a, b, dt| round((get(b).generation_tokens - get(a).generation_tokens).max(0.0) / dt)),
            "prompt_tokens_per_second": per(&|a, b, dt| round((get(b).prompt_tokens - get(a).prompt_tokens).max(0.0) / dt)),
            "ttft_ms_p50": per(&|a, b, _| get(b).ttft.quantile_since(&get(a).ttft, 0.5).map_or(Value::Null, round)),
            "running": per(&|_, b, _| round(get(b).running)),
            "waiting": per(&|_, b, _| round(get(b).waiting)),
            "kv_usage": per(&|_, b, _| {
                let l = get(b);
                if l.kv_replicas == 0 { Value::Null } else { round(l.kv_usage_sum / l.kv_replicas as f64) }
            }),
            "adapters_loaded": per(&|_, b, _| json!(b.loaded)),
        })
    });
    json!({
        "app": app,
        "deployment": deployment,
        "t": pairs.iter().map(|(_, b)| round(b.at)).collect::<Vec<_>>(),
        "requests_per_second": per(&|a, b, dt| rate(b.requests.saturating_sub(a.requests), dt)),
        "error_ratio": per(&|a, b, _| ratio(b.errors.saturating_sub(a.errors), b.requests.saturating_sub(a.requests))),
        "latency_ms": {"p50": quantile(0.5), "p95": quantile(0.95), "p99": quantile(0.99)},
        "hit_ratio": per(&|a, b, _| ratio(b.hits.saturating_sub(a.hits), b.lookups.saturating_sub(a.lookups))),
        "loads_per_second": per(&|a, b, dt| rate(b.loads.saturating_sub(a.loads), dt)),
        "evictions_per_second": per(&|a, b, dt| rate(b.evictions.saturating_sub(a.evictions), dt)),
        "ongoing": per(&|_, b, _| json!(b.ongoing)),
        "queued": per(&|_, b, _| json!(b.queued)),
        "llm": llm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn histogram(counts: &[(f64, u64)]) -> HistogramSnapshot {
        let count = counts.last().map_or(0, |c| c.1);
        HistogramSnapshot {
            buckets: counts.to_vec(),
            count,
            sum: Duration::ZERO,
        }
    }

    /// Quantiles of the observations between two snapshots, checked against the values
    /// placed: 100 observations in (0, 10 ms], 100 in (10, 100 ms]; before them, 50 slow ones
    /// that must not count.
    #[test]
    fn quantiles_come_from_the_difference_of_cumulative_buckets() {
        let mut earlier = Buckets::default();
        earlier.add(&histogram(&[(0.01, 0), (0.1, 0), (1.0, 50)]));
        let mut later = Buckets::default();
        later.add(&histogram(&[(0.01, 100), (0.1, 200), (1.0, 250)]));
        let p50 = later.quantile_since(&earlier, 0.5).unwrap();
        assert!((p50 - 10.0).abs() < 1e-9, "{p50}");
        let p75 = later.quantile_since(&earlier, 0.75).unwrap();
        assert!((p75 - 55.0).abs() < 1e-9, "{p75}");
        assert_eq!(later.quantile_since(&later, 0.5), None);
        // Two replicas' buckets add up.
        let mut two = Buckets::default();
        two.add(&histogram(&[(0.01, 1), (0.1, 1), (1.0, 1)]));
        two.add(&histogram(&[(0.01, 0), (0.1, 3), (1.0, 3)]));
        assert_eq!(two.bounds, vec![(0.01, 1), (0.1, 4), (1.0, 4)]);
        assert_eq!(two.count, 4);
    }
}
