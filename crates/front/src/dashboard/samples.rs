//! The dashboard's memory: once a second, each deployment's counters summed over this
//! node's replicas (requests by outcome, latency buckets, cache lookups, loads, evictions,
//! and the token counts and gauges of a kind that marks them, [`DashboardSeries`], as an LLM
//! engine does), kept for the last five minutes in a ring,
//! and turned into rates and percentiles over each second when the page asks. The page works
//! without Prometheus; sampling starts when the dashboard is first read, so a server nobody
//! watches pays nothing.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use modelmux_cache::HistogramSnapshot;
use modelmux_serve::{DashboardSeries, MetricFamily, MetricValue, MetricsReport};
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

/// The counters and gauges of a kind that generates tokens (the families its
/// [`DashboardSeries`] marks), summed over replicas.
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

    /// Adds a sample of every deployment in `report`, taken now.
    fn record(&self, report: &MetricsReport) {
        self.record_at(report, unix_seconds());
    }

    /// Adds a sample of every deployment in `report`, taken at `at` (Unix seconds).
    fn record_at(&self, report: &MetricsReport, at: f64) {
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
            if let Some(series) = r.dashboard {
                add_marked(point, &r.families, series);
            }
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

/// Adds the families of a replica that `series` marks (an LLM engine's) to `point`.
fn add_marked(point: &mut Point, families: &[MetricFamily], series: DashboardSeries) {
    let family = |name: &str| families.iter().find(|f| f.name == name);
    // A number family's samples summed (none: 0).
    let number = |name: &str| -> f64 {
        family(name).map_or(0.0, |f| {
            f.samples
                .iter()
                .map(|s| match &s.value {
                    MetricValue::Number(n) => *n,
                    MetricValue::Histogram(_) => 0.0,
                })
                .sum()
        })
    };
    let llm = point.llm.get_or_insert_with(LlmPoint::default);
    llm.generation_tokens += number(series.generation_tokens);
    llm.prompt_tokens += number(series.prompt_tokens);
    llm.running += number(series.running);
    llm.waiting += number(series.waiting);
    if family(series.cache_usage).is_some() {
        llm.kv_usage_sum += number(series.cache_usage);
        llm.kv_replicas += 1;
    }
    for s in family(series.time_to_first_token).map_or(&[][..], |f| &f.samples) {
        if let MetricValue::Histogram(h) = &s.value {
            llm.ttft.add(h);
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

    /// The series a kind marks, under names of its own.
    const MARKED: DashboardSeries = DashboardSeries {
        generation_tokens: "x_generated",
        prompt_tokens: "x_prompt",
        running: "x_running",
        waiting: "x_waiting",
        cache_usage: "x_cache_usage",
        time_to_first_token: "x_ttft",
    };

    /// One replica's report: `numbers` as families of one sample each, `ttft` as the
    /// histogram `x_ttft`.
    fn replica(
        deployment: &str,
        id: &str,
        by_class: [u64; 5],
        numbers: &[(&'static str, f64)],
        ttft: &[(f64, u64)],
        dashboard: Option<DashboardSeries>,
    ) -> modelmux_serve::ReplicaMetrics {
        use modelmux_serve::{MetricKind, MetricSample};
        let sample = |value| MetricSample {
            labels: Vec::new(),
            value,
        };
        let mut families: Vec<MetricFamily> = numbers
            .iter()
            .map(|&(name, n)| MetricFamily {
                name,
                help: "",
                kind: MetricKind::Gauge,
                samples: vec![sample(MetricValue::Number(n))],
            })
            .collect();
        families.push(MetricFamily {
            name: "x_ttft",
            help: "",
            kind: MetricKind::Histogram,
            samples: vec![sample(MetricValue::Histogram(histogram(ttft)))],
        });
        modelmux_serve::ReplicaMetrics {
            app: "a".into(),
            deployment: deployment.into(),
            replica: id.into(),
            node: None,
            requests_by_class: by_class,
            duration: histogram(&[(0.1, 0)]),
            ongoing: 0,
            cache: None,
            loaded_models: Vec::new(),
            families,
            dashboard,
        }
    }

    /// The token section comes from the families the kind marked, whatever their names, summed
    /// (gauges) or averaged (cache use) over replicas, as rates over the exact interval; a
    /// replica whose families are not marked has none, even under vLLM's names.
    #[test]
    fn the_token_series_are_the_ones_the_kind_marks() {
        let numbers = |generated, prompt, running, waiting, usage| {
            vec![
                ("x_generated", generated),
                ("x_prompt", prompt),
                ("x_running", running),
                ("x_waiting", waiting),
                ("x_cache_usage", usage),
            ]
        };
        let zero = [(0.01, 0), (0.1, 0), (1.0, 0)];
        let unmarked = |generated| {
            let vllm = [("vllm:generation_tokens_total", generated)];
            replica("plain", "p", [0; 5], &vllm, &zero, None)
        };
        let marked = Some(MARKED);
        let at_100 = MetricsReport {
            replicas: vec![
                replica(
                    "llm",
                    "r1",
                    [0; 5],
                    &numbers(10.0, 100.0, 1.0, 0.0, 0.5),
                    &zero,
                    marked,
                ),
                replica(
                    "llm",
                    "r2",
                    [0; 5],
                    &numbers(0.0, 0.0, 0.0, 0.0, 0.25),
                    &zero,
                    marked,
                ),
                unmarked(0.0),
            ],
            queues: Vec::new(),
        };
        let four_fast = [(0.01, 4), (0.1, 4), (1.0, 4)];
        let at_102 = MetricsReport {
            replicas: vec![
                replica(
                    "llm",
                    "r1",
                    [0, 10, 0, 0, 2],
                    &numbers(30.0, 140.0, 2.0, 1.0, 0.5),
                    &four_fast,
                    marked,
                ),
                replica(
                    "llm",
                    "r2",
                    [0, 4, 0, 0, 0],
                    &numbers(20.0, 60.0, 1.0, 2.0, 0.25),
                    &zero,
                    marked,
                ),
                unmarked(1000.0),
            ],
            queues: Vec::new(),
        };
        let samples = Samples::default();
        samples.record_at(&at_100, 100.0);
        samples.record_at(&at_102, 102.0);
        let series = samples.series();
        assert_eq!(series.len(), 2);
        let (llm, plain) = (&series[0], &series[1]);
        assert_eq!(llm["deployment"], "llm");
        assert_eq!(llm["t"], json!([102.0]));
        assert_eq!(llm["requests_per_second"], json!([8.0]));
        assert_eq!(llm["error_ratio"], json!([0.125]));
        let tokens = &llm["llm"];
        assert_eq!(tokens["generation_tokens_per_second"], json!([20.0]));
        assert_eq!(tokens["prompt_tokens_per_second"], json!([50.0]));
        assert_eq!(tokens["running"], json!([3.0]));
        assert_eq!(tokens["waiting"], json!([3.0]));
        assert_eq!(tokens["kv_usage"], json!([0.375]));
        // Four first tokens within 10 ms: the median is halfway into that bucket.
        assert_eq!(tokens["ttft_ms_p50"], json!([5.0]));
        assert_eq!(plain["deployment"], "plain");
        assert_eq!(plain["llm"], Value::Null);
    }
}
