//! `/metrics` in the Prometheus text format, rendered at scrape time from the counters each
//! replica and each model cache keep (no global registry).
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

use std::fmt::Write;

use modelmux_cache::{HistogramSnapshot, MetricsSnapshot};

use crate::state::FrontState;
use modelmux_serve::ReplicaMetrics;
use modelmux_serve::{MetricFamily, MetricSample};

/// Writes one metric family at a time, each with its HELP and TYPE once.
struct Exposition {
    out: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &HistogramSnapshot) {
        let bucket = format!("{name}_bucket");
        for (le, count) in &h.buckets {
            let le = le.to_string();
            self.sample(&bucket, &with(labels.to_vec(), "le", &le), count);
        }
        self.sample(&bucket, &with(labels.to_vec(), "le", "+Inf"), h.count);
        self.sample(&format!("{name}_sum"), labels, h.sum.as_secs_f64());
        self.sample(&format!("{name}_count"), labels, h.count);
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

type Counter = fn(&MetricsSnapshot) -> u64;

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

/// The labels of every replica series, borrowed from the replica.
fn labels(r: &ReplicaMetrics) -> Vec<(&str, &str)> {
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

fn with<'a>(
    mut labels: Vec<(&'a str, &'a str)>,
    key: &'a str,
    value: &'a str,
) -> Vec<(&'a str, &'a str)> {
    labels.push((key, value));
    labels
}

/// Renders every metric.
pub(crate) fn render(state: &FrontState) -> String {
    let mut x = Exposition {
        out: String::with_capacity(16 << 10),
    };
    let report = state.controller.metrics();
    let replicas = &report.replicas;

    x.family(
        "modelmux_requests_total",
        "counter",
        "Requests handled, by status class.",
    );
    for r in replicas {
        for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
            x.sample(
                "modelmux_requests_total",
                &with(labels(r), "status", class),
                r.requests_by_class[i],
            );
        }
    }
    x.family(
        "modelmux_request_duration_seconds",
        "histogram",
        "Time from dispatch to response headers.",
    );
    for r in replicas {
        x.histogram("modelmux_request_duration_seconds", &labels(r), &r.duration);
    }
    x.family(
        "modelmux_replica_ongoing_requests",
        "gauge",
        "Requests in progress on the replica.",
    );
    for r in replicas {
        x.sample("modelmux_replica_ongoing_requests", &labels(r), r.ongoing);
    }
    x.family(
        "modelmux_deployment_queued_requests",
        "gauge",
        "Requests waiting for a free replica.",
    );
    for q in &report.queues {
        let l = [("app", &*q.app), ("deployment", q.deployment.as_str())];
        x.sample("modelmux_deployment_queued_requests", &l, q.queued);
    }

    let caches: Vec<(&ReplicaMetrics, &MetricsSnapshot)> = replicas
        .iter()
        .filter_map(|r| r.cache.as_ref().map(|m| (r, m)))
        .collect();
    for (families, kind) in [
        (&CACHE_COUNTERS[..], "counter"),
        (&CACHE_GAUGES[..], "gauge"),
    ] {
        for (name, help, value) in families {
            x.family(name, kind, help);
            for (r, m) in &caches {
                x.sample(name, &labels(r), value(m));
            }
        }
    }
    x.family(
        "modelmux_model_load_duration_seconds",
        "histogram",
        "Time spent loading models.",
    );
    for (r, m) in &caches {
        x.histogram(
            "modelmux_model_load_duration_seconds",
            &labels(r),
            &m.load_duration,
        );
    }
    x.family(
        "modelmux_model_unload_duration_seconds",
        "histogram",
        "Time spent unloading models.",
    );
    for (r, m) in &caches {
        x.histogram(
            "modelmux_model_unload_duration_seconds",
            &labels(r),
            &m.unload_duration,
        );
    }
    // One series per loaded model: bounded by the caches' caps, so safe to label by model.
    x.family(
        "modelmux_model_loaded",
        "gauge",
        "1 for each model loaded on the replica.",
    );
    for r in replicas {
        for info in &r.loaded_models {
            x.sample(
                "modelmux_model_loaded",
                &with(labels(r), "model", info.id.as_str()),
                1,
            );
        }
    }
    x.family(
        "modelmux_model_pinned",
        "gauge",
        "For each model loaded on the replica: 1 if pinned against eviction, else 0.",
    );
    for r in replicas {
        for info in &r.loaded_models {
            x.sample(
                "modelmux_model_pinned",
                &with(labels(r), "model", info.id.as_str()),
                u8::from(info.pinned),
            );
        }
    }
    x.family(
        "modelmux_model_resident_bytes",
        "gauge",
        "Bytes each loaded model holds on the replica, where its size is known.",
    );
    for r in replicas {
        for info in &r.loaded_models {
            if let Some(bytes) = info.size_bytes {
                x.sample(
                    "modelmux_model_resident_bytes",
                    &with(labels(r), "model", info.id.as_str()),
                    bytes,
                );
            }
        }
    }
    deployment_metrics(&mut x, replicas);
    for family in state.metric_sources.iter().flat_map(|s| s.collect()) {
        x.family(family.name, family.kind.as_str(), family.help);
        for sample in &family.samples {
            custom_sample(&mut x, family.name, Vec::new(), sample);
        }
    }
    x.out
}

/// The families deployments add, merged by name across replicas (HELP and TYPE from the first
/// replica reporting a family).
fn deployment_metrics(x: &mut Exposition, replicas: &[ReplicaMetrics]) {
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
        x.family(family.name, family.kind.as_str(), family.help);
        for (r, sample) in samples {
            custom_sample(x, family.name, labels(r), sample);
        }
    }
}

/// One sample of a family a deployment or the process added, with `labels` before its own.
fn custom_sample<'a>(
    x: &mut Exposition,
    name: &str,
    mut labels: Vec<(&'a str, &'a str)>,
    sample: &'a MetricSample,
) {
    labels.extend(sample.labels.iter().map(|(k, v)| (*k, v.as_str())));
    match &sample.value {
        modelmux_serve::MetricValue::Number(v) => x.sample(name, &labels, v),
        modelmux_serve::MetricValue::Histogram(h) => x.histogram(name, &labels, h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped_and_histograms_are_cumulative_with_inf() {
        let mut x = Exposition { out: String::new() };
        x.sample("m", &[("model", "a\"b\\c\nd")], 1);
        assert_eq!(x.out, "m{model=\"a\\\"b\\\\c\\nd\"} 1\n");
        let mut x = Exposition { out: String::new() };
        let h = HistogramSnapshot {
            buckets: vec![(0.1, 1), (1.0, 2)],
            count: 3,
            sum: std::time::Duration::from_millis(2500),
        };
        x.histogram("h", &[("a", "b")], &h);
        assert!(
            x.out.contains("h_bucket{a=\"b\",le=\"0.1\"} 1\n"),
            "{}",
            x.out
        );
        assert!(x.out.contains("h_bucket{a=\"b\",le=\"+Inf\"} 3\n"));
        assert!(x.out.contains("h_sum{a=\"b\"} 2.5\n"));
        assert!(x.out.contains("h_count{a=\"b\"} 3\n"));
    }
}
