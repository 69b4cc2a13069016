//! `/metrics` in the Prometheus text format (version 0.0.4), encoded by `prometheus-client`
//! from one [`Registry`] per server (no global state): its one [`Collector`] reads, at scrape
//! time, the counters each replica and each model cache keep, the families deployments add and
//! the process's own.
//!
//! Every series has `app`, `deployment` and `replica` labels (and `node`, in a cluster). Mapping from Ray Serve:
//!
//! | modelmux | Ray Serve |
//! |---|---|
//! | `modelmux_requests_total` | `ray_serve_deployment_request_counter_total` |
//! | `modelmux_request_duration_seconds` | `ray_serve_deployment_processing_latency_ms` (in seconds) |
//! | `modelmux_replica_ongoing_requests` | `ray_serve_replica_processing_queries` |
//! | `modelmux_deployment_queued_requests` | `ray_serve_deployment_queued_queries` |
//! | `modelmux_model_loads_total` | `ray_serve_multiplexed_models_load_counter_total` |
//! | `modelmux_model_unloads_total` | `ray_serve_multiplexed_models_unload_counter_total` |
//! | `modelmux_model_load_duration_seconds` | `ray_serve_multiplexed_model_load_latency_ms` (in seconds) |
//! | `modelmux_model_unload_duration_seconds` | `ray_serve_multiplexed_model_unload_latency_ms` (in seconds) |
//! | `modelmux_models_loaded` | `ray_serve_num_multiplexed_models` |
//! | `modelmux_model_loaded{model=...}` | `ray_serve_registered_multiplexed_model_id` |
//! | `modelmux_cache_hits_total` + `modelmux_cache_misses_total` | `ray_serve_multiplexed_get_model_requests_counter_total` |
//! | `modelmux_model_load_failures_total`, `modelmux_model_unload_failures_total`, `modelmux_model_evictions_total`, `modelmux_models_loading`, `modelmux_model_bytes`, `modelmux_model_pinned{model=...}`, `modelmux_model_resident_bytes{model=...}` | (none) |
//!
//! Names here are the names exported, counters with their `_total`: the library adds that
//! suffix itself, so [`family`] takes it off before handing a counter's name over.

use std::fmt;
use std::sync::Arc;

use modelmux_cache::{HistogramSnapshot, MetricsSnapshot};
use modelmux_serve::{
    Controller, MetricFamily, MetricKind, MetricSample, MetricValue, MetricsReport, MetricsSource,
    ReplicaMetrics,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// The `Content-Type` of `/metrics`: the Prometheus text format, version 0.0.4.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A server's registry: what `controller` reports of its replicas, and `process`, the
/// process's own sources (not a replica's).
pub(crate) fn registry(
    controller: Arc<Controller>,
    process: Vec<Arc<dyn MetricsSource>>,
) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        controller,
        process,
    }));
    registry
}

/// Every metric in `registry`, in the Prometheus text format.
pub(crate) fn render(registry: &Registry) -> String {
    let mut out = String::with_capacity(16 << 10);
    if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, registry) {
        // Writing to a `String` does not fail, nor does anything the collector encodes.
        tracing::warn!(error = %e, "encoding /metrics failed");
    }
    out
}

/// Reads the serve layer's counters at each scrape.
struct Scrape {
    controller: Arc<Controller>,
    process: Vec<Arc<dyn MetricsSource>>,
}

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrape")
            .field("process_sources", &self.process.len())
            .finish_non_exhaustive()
    }
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let report = self.controller.metrics();
        let process: Vec<MetricFamily> = self.process.iter().flat_map(|s| s.collect()).collect();
        encode_report(&mut encoder, &report, &process)
    }
}

/// Every family of `report`, then the process's families.
fn encode_report(
    x: &mut DescriptorEncoder<'_>,
    report: &MetricsReport,
    process: &[MetricFamily],
) -> fmt::Result {
    requests(x, report)?;
    caches(x, &report.replicas)?;
    models(x, &report.replicas)?;
    deployment_families(x, &report.replicas)?;
    for family in process {
        let mut samples = encode_family(x, family)?;
        for sample in &family.samples {
            sample_value(&mut samples, family.kind, Vec::new(), sample)?;
        }
    }
    Ok(())
}

/// The labels of a series.
type Labels<'a> = Vec<(&'a str, &'a str)>;

/// The labels of every replica series, borrowed from the replica.
fn labels(r: &ReplicaMetrics) -> Labels<'_> {
    let mut labels = vec![
        ("app", &*r.app),
        ("deployment", &*r.deployment),
        ("replica", &*r.replica),
    ];
    // In a cluster, every series also names its node.
    if let Some(node) = &r.node {
        labels.push(("node", node));
    }
    labels
}

fn with<'a>(mut labels: Labels<'a>, key: &'a str, value: &'a str) -> Labels<'a> {
    labels.push((key, value));
    labels
}

/// Starts a family: its HELP and TYPE. `name` is the name exported (a counter's with its
/// `_total`, which the library adds back).
fn family<'s>(
    x: &'s mut DescriptorEncoder<'_>,
    name: &'s str,
    help: &str,
    kind: MetricType,
) -> Result<MetricEncoder<'s>, fmt::Error> {
    let name = match kind {
        MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
        _ => name,
    };
    x.encode_descriptor(name, help, None, kind)
}

fn counter(f: &mut MetricEncoder<'_>, labels: &Labels<'_>, value: u64) -> fmt::Result {
    ConstCounter::new(value).encode(f.encode_family(labels)?)
}

fn gauge(f: &mut MetricEncoder<'_>, labels: &Labels<'_>, value: u64) -> fmt::Result {
    ConstGauge::new(value).encode(f.encode_family(labels)?)
}

/// A histogram sample: `h`'s buckets are cumulative, the library's are not (it adds them up,
/// and writes the `+Inf` bucket as the count).
fn histogram(f: &mut MetricEncoder<'_>, labels: &Labels<'_>, h: &HistogramSnapshot) -> fmt::Result {
    let mut below = 0;
    let buckets: Vec<(f64, u64)> = h
        .buckets
        .iter()
        .map(|&(le, cumulative)| {
            let n = cumulative.saturating_sub(below);
            below = cumulative;
            (le, n)
        })
        .collect();
    f.encode_family(labels)?.encode_histogram::<NoLabelSet>(
        h.sum.as_secs_f64(),
        h.count,
        &buckets,
        None,
    )
}

/// Requests by status class, their duration, those in progress and those queued.
fn requests(x: &mut DescriptorEncoder<'_>, report: &MetricsReport) -> fmt::Result {
    let replicas = &report.replicas;
    let mut f = family(
        x,
        "modelmux_requests_total",
        "Requests handled, by status class.",
        MetricType::Counter,
    )?;
    for r in replicas {
        for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
            counter(
                &mut f,
                &with(labels(r), "status", class),
                r.requests_by_class[i],
            )?;
        }
    }
    let mut f = family(
        x,
        "modelmux_request_duration_seconds",
        "Time from dispatch to response headers.",
        MetricType::Histogram,
    )?;
    for r in replicas {
        histogram(&mut f, &labels(r), &r.duration)?;
    }
    let mut f = family(
        x,
        "modelmux_replica_ongoing_requests",
        "Requests in progress on the replica.",
        MetricType::Gauge,
    )?;
    for r in replicas {
        gauge(&mut f, &labels(r), r.ongoing as u64)?;
    }
    let mut f = family(
        x,
        "modelmux_deployment_queued_requests",
        "Requests waiting for a free replica.",
        MetricType::Gauge,
    )?;
    for q in &report.queues {
        let l = vec![("app", &*q.app), ("deployment", q.deployment.as_str())];
        gauge(&mut f, &l, q.queued as u64)?;
    }
    Ok(())
}

type Counter = fn(&MetricsSnapshot) -> u64;
type Durations = fn(&MetricsSnapshot) -> &HistogramSnapshot;

const CACHE_COUNTERS: [(&str, &str, Counter); 8] = [
    (
        "modelmux_cache_hits_total",
        "Model gets served from the replica's cache.",
        |m| m.hits,
    ),
    (
        "modelmux_cache_misses_total",
        "Model gets that waited for a load.",
        |m| m.misses,
    ),
    ("modelmux_model_loads_total", "Model loads started.", |m| {
        m.loads
    }),
    (
        "modelmux_model_load_failures_total",
        "Model loads that failed, panicked or timed out.",
        |m| m.load_failures,
    ),
    ("modelmux_model_unloads_total", "Models unloaded.", |m| {
        m.unloads
    }),
    (
        "modelmux_model_unload_failures_total",
        "Unload hooks that failed or panicked.",
        |m| m.unload_failures,
    ),
    (
        "modelmux_model_evictions_total",
        "Models evicted to make room.",
        |m| m.evictions,
    ),
    (
        "modelmux_model_loads_abandoned_total",
        "Loads dropped before they started: everyone waiting for them had left.",
        |m| m.loads_abandoned,
    ),
];

const CACHE_GAUGES: [(&str, &str, Counter); 3] = [
    (
        "modelmux_models_loaded",
        "Models loaded on the replica.",
        |m| m.gauges.loaded as u64,
    ),
    (
        "modelmux_models_loading",
        "Models being loaded on the replica.",
        |m| m.gauges.loading as u64,
    ),
    (
        "modelmux_model_bytes",
        "Bytes held by the replica's models (loaded, loading, draining).",
        |m| m.gauges.used_bytes,
    ),
];

/// The model caches' counters, gauges and load and unload durations.
fn caches(x: &mut DescriptorEncoder<'_>, replicas: &[ReplicaMetrics]) -> fmt::Result {
    let caches: Vec<(&ReplicaMetrics, &MetricsSnapshot)> = replicas
        .iter()
        .filter_map(|r| r.cache.as_ref().map(|m| (r, m)))
        .collect();
    for (name, help, value) in CACHE_COUNTERS {
        let mut f = family(x, name, help, MetricType::Counter)?;
        for (r, m) in &caches {
            counter(&mut f, &labels(r), value(m))?;
        }
    }
    for (name, help, value) in CACHE_GAUGES {
        let mut f = family(x, name, help, MetricType::Gauge)?;
        for (r, m) in &caches {
            gauge(&mut f, &labels(r), value(m))?;
        }
    }
    let durations: [(&str, &str, Durations); 2] = [
        (
            "modelmux_model_load_duration_seconds",
            "Time spent loading models.",
            |m| &m.load_duration,
        ),
        (
            "modelmux_model_unload_duration_seconds",
            "Time spent unloading models.",
            |m| &m.unload_duration,
        ),
    ];
    for (name, help, value) in durations {
        let mut f = family(x, name, help, MetricType::Histogram)?;
        for (r, m) in &caches {
            histogram(&mut f, &labels(r), value(m))?;
        }
    }
    Ok(())
}

/// One series per loaded model: bounded by the caches' caps, so safe to label by model.
fn models(x: &mut DescriptorEncoder<'_>, replicas: &[ReplicaMetrics]) -> fmt::Result {
    let mut f = family(
        x,
        "modelmux_model_loaded",
        "1 for each model loaded on the replica.",
        MetricType::Gauge,
    )?;
    for r in replicas {
        for info in &r.loaded_models {
            gauge(&mut f, &with(labels(r), "model", info.id.as_str()), 1)?;
        }
    }
    let mut f = family(
        x,
        "modelmux_model_pinned",
        "For each model loaded on the replica: 1 if pinned against eviction, else 0.",
        MetricType::Gauge,
    )?;
    for r in replicas {
        for info in &r.loaded_models {
            let l = with(labels(r), "model", info.id.as_str());
            gauge(&mut f, &l, u64::from(info.pinned))?;
        }
    }
    let mut f = family(
        x,
        "modelmux_model_resident_bytes",
        "Bytes each loaded model holds on the replica, where its size is known.",
        MetricType::Gauge,
    )?;
    for r in replicas {
        for info in &r.loaded_models {
            if let Some(bytes) = info.size_bytes {
                gauge(&mut f, &with(labels(r), "model", info.id.as_str()), bytes)?;
            }
        }
    }
    Ok(())
}

/// The families deployments add, merged by name across replicas (HELP and TYPE from the first
/// replica reporting a family).
fn deployment_families(x: &mut DescriptorEncoder<'_>, replicas: &[ReplicaMetrics]) -> fmt::Result {
    let mut families: Vec<(&MetricFamily, Vec<(&ReplicaMetrics, &MetricSample)>)> = Vec::new();
    for r in replicas {
        for family in &r.families {
            let samples = family.samples.iter().map(|s| (r, s));
            match families.iter_mut().find(|(f, _)| f.name == family.name) {
                Some((_, all)) => all.extend(samples),
                None => families.push((family, samples.collect())),
            }
        }
    }
    for (family, samples) in families {
        let mut f = encode_family(x, family)?;
        for (r, sample) in samples {
            sample_value(&mut f, family.kind, labels(r), sample)?;
        }
    }
    Ok(())
}

/// The HELP and TYPE of a family a deployment or the process added.
fn encode_family<'s>(
    x: &'s mut DescriptorEncoder<'_>,
    f: &'s MetricFamily,
) -> Result<MetricEncoder<'s>, fmt::Error> {
    let kind = match f.kind {
        MetricKind::Counter => MetricType::Counter,
        MetricKind::Gauge => MetricType::Gauge,
        MetricKind::Histogram => MetricType::Histogram,
    };
    family(x, f.name, f.help, kind)
}

/// One sample of a family a deployment or the process added, with `labels` before its own. A
/// whole number is written as one (`3`, not `3.0`); a value of the wrong shape for its
/// family's type (a histogram in a counter's family, a number in a histogram's) is left out.
fn sample_value<'a>(
    f: &mut MetricEncoder<'_>,
    kind: MetricKind,
    mut labels: Labels<'a>,
    sample: &'a MetricSample,
) -> fmt::Result {
    labels.extend(sample.labels.iter().map(|(k, v)| (*k, v.as_str())));
    match (&sample.value, kind) {
        (MetricValue::Histogram(h), MetricKind::Histogram) => histogram(f, &labels, h),
        (&MetricValue::Number(v), MetricKind::Counter) => match whole(v) {
            Some(n) => counter(f, &labels, n),
            None => ConstCounter::new(v).encode(f.encode_family(&labels)?),
        },
        (&MetricValue::Number(v), MetricKind::Gauge) => match whole(v) {
            Some(n) => gauge(f, &labels, n),
            None => ConstGauge::new(v).encode(f.encode_family(&labels)?),
        },
        _ => Ok(()),
    }
}

/// `v` as a whole number, when it is one that an `f64` holds exactly.
fn whole(v: f64) -> Option<u64> {
    (v.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&v)).then_some(v as u64)
}

#[cfg(test)]
mod tests;
