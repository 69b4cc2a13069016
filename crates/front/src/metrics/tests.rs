//! The exposition's exact text: every family's HELP and TYPE as `/metrics` has always written
//! them (the README, the Grafana dashboards and the Ray Serve mapping name these), and the
//! families deployments add, with escaped labels, whole and fractional numbers and histograms.

use std::time::Duration;

use super::*;

/// Encodes `report` and `process` alone, as a server's registry would.
fn text(report: MetricsReport, process: Vec<MetricFamily>) -> String {
    #[derive(Debug)]
    struct Fixed(MetricsReport, Vec<MetricFamily>);
    impl Collector for Fixed {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
            encode_report(&mut encoder, &self.0, &self.1)
        }
    }
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Fixed(report, process)));
    render(&registry)
}

fn empty() -> MetricsReport {
    MetricsReport {
        replicas: Vec::new(),
        queues: Vec::new(),
    }
}

/// Every family `/metrics` always has, in order, as written before prometheus-client.
const DESCRIPTORS: &str = "\
# HELP modelmux_requests_total Requests handled, by status class.\n\
# TYPE modelmux_requests_total counter\n\
# HELP modelmux_request_duration_seconds Time from dispatch to response headers.\n\
# TYPE modelmux_request_duration_seconds histogram\n\
# HELP modelmux_replica_ongoing_requests Requests in progress on the replica.\n\
# TYPE modelmux_replica_ongoing_requests gauge\n\
# HELP modelmux_deployment_queued_requests Requests waiting for a free replica.\n\
# TYPE modelmux_deployment_queued_requests gauge\n\
# HELP modelmux_cache_hits_total Model gets served from the replica's cache.\n\
# TYPE modelmux_cache_hits_total counter\n\
# HELP modelmux_cache_misses_total Model gets that waited for a load.\n\
# TYPE modelmux_cache_misses_total counter\n\
# HELP modelmux_model_loads_total Model loads started.\n\
# TYPE modelmux_model_loads_total counter\n\
# HELP modelmux_model_load_failures_total Model loads that failed, panicked or timed out.\n\
# TYPE modelmux_model_load_failures_total counter\n\
# HELP modelmux_model_unloads_total Models unloaded.\n\
# TYPE modelmux_model_unloads_total counter\n\
# HELP modelmux_model_unload_failures_total Unload hooks that failed or panicked.\n\
# TYPE modelmux_model_unload_failures_total counter\n\
# HELP modelmux_model_evictions_total Models evicted to make room.\n\
# TYPE modelmux_model_evictions_total counter\n\
# HELP modelmux_model_loads_abandoned_total Loads dropped before they started: everyone waiting for them had left.\n\
# TYPE modelmux_model_loads_abandoned_total counter\n\
# HELP modelmux_models_loaded Models loaded on the replica.\n\
# TYPE modelmux_models_loaded gauge\n\
# HELP modelmux_models_loading Models being loaded on the replica.\n\
# TYPE modelmux_models_loading gauge\n\
# HELP modelmux_model_bytes Bytes held by the replica's models (loaded, loading, draining).\n\
# TYPE modelmux_model_bytes gauge\n\
# HELP modelmux_model_load_duration_seconds Time spent loading models.\n\
# TYPE modelmux_model_load_duration_seconds histogram\n\
# HELP modelmux_model_unload_duration_seconds Time spent unloading models.\n\
# TYPE modelmux_model_unload_duration_seconds histogram\n\
# HELP modelmux_model_loaded 1 for each model loaded on the replica.\n\
# TYPE modelmux_model_loaded gauge\n\
# HELP modelmux_model_pinned For each model loaded on the replica: 1 if pinned against eviction, else 0.\n\
# TYPE modelmux_model_pinned gauge\n\
# HELP modelmux_model_resident_bytes Bytes each loaded model holds on the replica, where its size is known.\n\
# TYPE modelmux_model_resident_bytes gauge\n\
";

#[test]
fn every_family_keeps_its_name_help_and_type() {
    assert_eq!(text(empty(), Vec::new()), DESCRIPTORS);
}

#[test]
fn queues_are_labelled_by_app_and_deployment() {
    let report = MetricsReport {
        replicas: Vec::new(),
        queues: vec![modelmux_serve::QueueReport {
            app: "shop".into(),
            deployment: "Rank".into(),
            queued: 7,
        }],
    };
    let text = text(report, Vec::new());
    assert!(
        text.contains(
            "# TYPE modelmux_deployment_queued_requests gauge\n\
             modelmux_deployment_queued_requests{app=\"shop\",deployment=\"Rank\"} 7\n"
        ),
        "{text}"
    );
}

#[test]
fn added_families_are_written_exactly() {
    let h = HistogramSnapshot {
        buckets: vec![(0.1, 1), (1.0, 2)],
        count: 3,
        sum: Duration::from_millis(2500),
    };
    let process = vec![
        MetricFamily {
            name: "modelmux_things_total",
            help: "Things, by model.",
            kind: MetricKind::Counter,
            samples: vec![
                MetricSample {
                    labels: vec![("model", "a\"b\\c\nd".to_owned())],
                    value: MetricValue::Number(3.0),
                },
                MetricSample {
                    labels: vec![("model", "e".to_owned())],
                    value: MetricValue::Number(0.5),
                },
            ],
        },
        MetricFamily::single(
            "vllm:kv_cache_usage_perc",
            "A share.",
            MetricKind::Gauge,
            MetricValue::Number(0.25),
        ),
        MetricFamily::single(
            "modelmux_idle",
            "A whole gauge.",
            MetricKind::Gauge,
            MetricValue::Number(0.0),
        ),
        MetricFamily {
            name: "h_seconds",
            help: "A histogram.",
            kind: MetricKind::Histogram,
            samples: vec![MetricSample {
                labels: vec![("a", "b".to_owned())],
                value: MetricValue::Histogram(h),
            }],
        },
        // A value of the wrong shape for its family is left out.
        MetricFamily::single(
            "modelmux_odd_total",
            "A counter given a histogram.",
            MetricKind::Counter,
            MetricValue::Histogram(HistogramSnapshot {
                buckets: Vec::new(),
                count: 0,
                sum: Duration::ZERO,
            }),
        ),
    ];
    let text = text(empty(), process);
    let added = text.strip_prefix(DESCRIPTORS).unwrap();
    assert_eq!(
        added,
        "# HELP modelmux_things_total Things, by model.\n\
         # TYPE modelmux_things_total counter\n\
         modelmux_things_total{model=\"a\\\"b\\\\c\\nd\"} 3\n\
         modelmux_things_total{model=\"e\"} 0.5\n\
         # HELP vllm:kv_cache_usage_perc A share.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc 0.25\n\
         # HELP modelmux_idle A whole gauge.\n\
         # TYPE modelmux_idle gauge\n\
         modelmux_idle 0\n\
         # HELP h_seconds A histogram.\n\
         # TYPE h_seconds histogram\n\
         h_seconds_bucket{a=\"b\",le=\"0.1\"} 1\n\
         h_seconds_bucket{a=\"b\",le=\"1\"} 2\n\
         h_seconds_bucket{a=\"b\",le=\"+Inf\"} 3\n\
         h_seconds_sum{a=\"b\"} 2.5\n\
         h_seconds_count{a=\"b\"} 3\n\
         # HELP modelmux_odd_total A counter given a histogram.\n\
         # TYPE modelmux_odd_total counter\n"
    );
}

#[test]
fn whole_numbers_are_those_an_f64_holds_exactly() {
    assert_eq!(whole(0.0), Some(0));
    assert_eq!(whole(96.0), Some(96));
    assert_eq!(whole(0.5), None);
    assert_eq!(whole(-1.0), None);
    assert_eq!(whole(f64::NAN), None);
    assert_eq!(whole(f64::INFINITY), None);
    assert_eq!(whole(1e300), None);
}
