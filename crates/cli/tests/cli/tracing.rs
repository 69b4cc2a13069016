//! Traces across every hop, received by an OTLP/HTTP receiver that decodes them with the
//! `opentelemetry-proto` package (`scripts/tracing/otlp_receiver.py`): a request with a
//! caller's `traceparent`, through a router-only ingress to a node of the cluster (a forward),
//! where its model loads; and an OpenAI request whose front deployment calls the LLM
//! deployment through a handle (with the engine's prefill and decode spans). One trace per request, parented to the caller's span, with the
//! ingress, queue-wait, forward, model-load and inference spans; the response carries the
//! trace's `traceparent`; a request the caller did not sample is not traced.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use modelmux_cluster::LocalEtcd;
use serde_json::Value;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

/// The receiver, and the spans it printed so far.
struct Receiver {
    child: std::process::Child,
    url: String,
    spans: Arc<parking_lot::Mutex<Vec<Value>>>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn receiver() -> Receiver {
    let python = std::env::var("MODELMUX_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("MODELMUX_TEST_PYTHON must name a Python with opentelemetry-proto (scripts/test sets it)")
    });
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scripts/tracing/otlp_receiver.py");
    let mut child = Command::new(python)
        .arg(script)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("the receiver said {first:?}"))
        .to_owned();
    let spans = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let sink = spans.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            sink.lock()
                .push(serde_json::from_str::<Value>(&line).unwrap());
        }
    });
    Receiver { child, url, spans }
}

impl Receiver {
    /// The spans of `trace`, waiting (up to 10 s) until `done` says they are all there.
    /// Checks that no span of `trace` was exported: `sampled` sends a request that is traced
    /// (returning its trace id) after the one that must not be, and that one's spans are
    /// waited for first, so anything exported before them has arrived (the exporter sends
    /// spans in the order they end). No fixed sleep: on a slow machine this waits longer.
    fn exported_after(&self, trace: &str, sampled: impl FnOnce() -> &'static str) {
        let later = sampled();
        self.trace(later, |s| !named(s, "ingress").is_empty());
        let leaked: Vec<Value> = (self.spans.lock().iter())
            .filter(|s| s["trace_id"] == trace)
            .cloned()
            .collect();
        assert!(
            leaked.is_empty(),
            "a request that was not sampled was traced: {leaked:#?}"
        );
    }

    fn trace(&self, trace: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        for _ in 0..200 {
            let all = self.spans.lock().clone();
            assert!(
                all.iter().all(|s| s.get("error").is_none()),
                "the receiver could not decode an export: {all:?}"
            );
            let of: Vec<Value> = all.into_iter().filter(|s| s["trace_id"] == trace).collect();
            if done(&of) {
                return of;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "the spans of {trace} did not all arrive: {:#?}",
            self.spans.lock()
        )
    }
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The node's deployment config with tracing to `collector`.
fn cluster_config(collector: &str) -> String {
    format!(
        "
http_options: {{host: 127.0.0.1, port: 0}}
cluster: {{name: traced, lease_ttl_s: 2}}
tracing: {{otlp_endpoint: '{collector}'}}
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Model
        num_replicas: 1
        max_models_per_replica: 2
        model: {{kind: synthetic, load_ms: 50, size_mb: 1, infer_ms: 2}}
"
    )
}

/// GET `/` with a model id and `traceparent`: status and the response's `traceparent`.
fn get_traced(url: &str, model: &str, traceparent: &str) -> (u16, Option<String>) {
    let request = hyper::Request::get("/")
        .header("serve_multiplexed_model_id", model)
        .header("traceparent", traceparent);
    let (status, headers, _) = common::send_with_headers(url, request, Vec::new());
    let header = headers
        .get("traceparent")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, header)
}

#[test]
fn a_forwarded_request_is_one_trace_under_the_callers_span() {
    let collector = receiver();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let etcd = rt.block_on(LocalEtcd::start(1)).unwrap();
    let config = cluster_config(&collector.url);
    let cluster = etcd.cluster_url();
    let node = common::serve_with(
        &config,
        &["--cluster", &cluster, "--node-id", "n1", "--role", "node"],
    );
    let ingress = common::serve_with(
        &config,
        &[
            "--cluster",
            &cluster,
            "--node-id",
            "in",
            "--role",
            "ingress",
        ],
    );
    // The ingress routes once it has seen the node's replica.
    let mut status = 0;
    for _ in 0..100 {
        status = common::curl(&ingress.url, "warm").0;
        if status == 200 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status, 200);

    let caller = format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01");
    let (status, header) = get_traced(&ingress.url, "cold-model", &caller);
    assert_eq!(status, 200);
    let header = header.expect("the response carries traceparent");
    assert!(
        header.starts_with(&format!("00-{CALLER_TRACE}-")),
        "{header}"
    );
    let spans = collector.trace(CALLER_TRACE, |s| {
        named(s, "ingress").len() == 2 && !named(s, "inference").is_empty()
    });
    let by_id: HashMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["span_id"].as_str().unwrap(), s))
        .collect();
    // The ingress node's root hangs under the caller; the node's root under the ingress's.
    let roots = named(&spans, "ingress");
    let first = roots
        .iter()
        .find(|s| s["parent_span_id"] == CALLER_SPAN)
        .unwrap_or_else(|| panic!("no ingress span under the caller's: {spans:#?}"));
    assert_eq!(first["resource"]["service.name"], "modelmux");
    assert_eq!(first["kind"], 2, "SERVER");
    assert!(header.contains(first["span_id"].as_str().unwrap()));
    let second = roots
        .iter()
        .find(|s| s["parent_span_id"] == first["span_id"])
        .unwrap_or_else(|| {
            panic!("the node's ingress span is not under the ingress's: {spans:#?}")
        });
    // Every other span hangs under one of the two roots, and lies within it.
    for s in &spans {
        if s["name"] == "ingress" {
            continue;
        }
        let parent = by_id[s["parent_span_id"].as_str().unwrap()];
        assert_eq!(parent["name"], "ingress", "{s}");
        assert!(
            s["start"].as_u64() >= parent["start"].as_u64(),
            "{s} starts before {parent}"
        );
        assert!(
            s["end"].as_u64() <= parent["end"].as_u64(),
            "{s} ends after {parent}"
        );
    }
    let under = |root: &Value, name: &str| {
        spans
            .iter()
            .any(|s| s["name"] == name && s["parent_span_id"] == root["span_id"])
    };
    assert!(
        under(first, "queue_wait") && under(first, "forward"),
        "{spans:#?}"
    );
    assert!(
        under(second, "queue_wait") && under(second, "model_load") && under(second, "inference"),
        "{spans:#?}"
    );
    let load = named(&spans, "model_load")[0];
    assert_eq!(load["attributes"]["model_id"], "cold-model");
    assert_eq!(second["attributes"]["http.status_code"], "200");

    // Not sampled by the caller: no trace, no header.
    let unsampled = "00-11111111111111111111111111111111-2222222222222222-00";
    let (status, header) = get_traced(&ingress.url, "cold-model", unsampled);
    assert_eq!((status, header), (200, None));
    collector.exported_after("11111111111111111111111111111111", || {
        let later = "00-33333333333333333333333333333333-4444444444444444-01";
        get_traced(&ingress.url, "cold-model", later);
        "33333333333333333333333333333333"
    });
    drop((node, ingress));
}

#[test]
fn a_handle_call_stays_in_the_callers_trace() {
    let collector = receiver();
    let gguf = std::env::var("MODELMUX_TEST_GGUF")
        .unwrap_or_else(|_| panic!("MODELMUX_TEST_GGUF is not set: run ./scripts/test"));
    let config = format!(
        "
http_options: {{port: 0}}
tracing: {{otlp_endpoint: '{}'}}
applications:
  - name: llm
    deployments:
      - name: LLMServer
        model:
          kind: llm
          model_loading_config: {{model_id: smollm2, model_source: '{gguf}'}}
          engine_kwargs: {{max_num_seqs: 4, max_model_len: 512}}
",
        collector.url
    );
    let server = common::serve(&config);
    let trace = "aaaabbbbccccddddeeeeffff00001111";
    let request = hyper::Request::builder()
        .method("POST")
        .uri("/v1/completions")
        .header("content-type", "application/json")
        .header("traceparent", format!("00-{trace}-{CALLER_SPAN}-01"));
    let body = br#"{"model": "smollm2", "prompt": "Hello", "max_tokens": 3}"#.to_vec();
    let (status, answer) = common::send(&server.url, request, body);
    assert_eq!(status, 200, "{answer}");
    // Every span read below: they come in batches, cut each second.
    let spans = collector.trace(trace, |s| {
        named(s, "inference").len() >= 2
            && !named(s, "decode").is_empty()
            && !named(s, "prefill").is_empty()
            && !named(s, "ingress").is_empty()
    });
    // The engine's two phases: prefill to the first token, then decode.
    let (prefill, decode) = (named(&spans, "prefill")[0], named(&spans, "decode")[0]);
    assert!(prefill["end"].as_u64() <= decode["start"].as_u64());
    assert_eq!(decode["attributes"]["completion_tokens"], "3");
    let root = named(&spans, "ingress")[0];
    assert_eq!(root["parent_span_id"], CALLER_SPAN);
    let deployments: Vec<&str> = named(&spans, "inference")
        .iter()
        .map(|s| s["attributes"]["deployment"].as_str().unwrap())
        .collect();
    assert!(
        deployments.contains(&"LLMServer") && deployments.contains(&"LLMServer-openai"),
        "the handle call's spans are not in the trace: {spans:#?}"
    );
    assert!(
        spans
            .iter()
            .filter(|s| s["name"] != "ingress")
            .all(|s| s["parent_span_id"] == root["span_id"]),
        "{spans:#?}"
    );
    drop(server);
}

/// `tracing.sample_ratio` decides for requests that come without a `traceparent` (a caller's
/// decision, sampled or not, is kept whatever the ratio): with 0 none of them is traced, with
/// 1 every one is, as its own trace.
#[test]
fn the_sample_ratio_decides_for_requests_without_a_traceparent() {
    let collector = receiver();
    for ratio in ["0.0", "1.0"] {
        let config = format!(
            "
http_options: {{port: 0}}
tracing: {{otlp_endpoint: '{}', sample_ratio: {ratio}}}
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Classifier
        model:
          kind: onnx
          repository: builtin://demo
",
            collector.url
        );
        let server = common::serve(&config);
        let request = hyper::Request::post("/").header("serve_multiplexed_model_id", "customer-1");
        let body = br#"{"inputs": [[0.5, -1.2, 3.3, 0.1]]}"#.to_vec();
        let (status, headers, answer) =
            common::send_with_headers(&server.url, request, body.clone());
        assert_eq!(status, 200, "{answer}");
        let traceparent = headers
            .get("traceparent")
            .map(|v| v.to_str().unwrap().to_owned());
        if ratio == "0.0" {
            assert_eq!(traceparent, None, "an unsampled request says it was traced");
            // Requests without a traceparent export nothing; a caller's sampled one still does.
            let before: usize = collector.spans.lock().len();
            let caller = "00-55555555555555555555555555555555-6666666666666666-01";
            let request = hyper::Request::post("/")
                .header("serve_multiplexed_model_id", "customer-1")
                .header("traceparent", caller);
            assert_eq!(common::send(&server.url, request, body).0, 200);
            let spans = collector.trace("55555555555555555555555555555555", |s| {
                !named(s, "ingress").is_empty() && !named(s, "inference").is_empty()
            });
            let all = collector.spans.lock();
            let others: Vec<&Value> = all[..before]
                .iter()
                .chain(all[before..].iter().filter(|s| !spans.contains(s)))
                .collect();
            assert!(
                others.is_empty(),
                "sample_ratio 0 traced a request: {others:#?}"
            );
        } else {
            let traceparent = traceparent.expect("a request sampled by the ratio says so");
            let trace = traceparent.split('-').nth(1).unwrap().to_owned();
            let spans = collector.trace(&trace, |s| {
                !named(s, "ingress").is_empty() && !named(s, "inference").is_empty()
            });
            let root = named(&spans, "ingress")[0];
            assert_eq!(root["parent_span_id"], "", "{root}");
        }
        drop(server);
    }
}
