//! Traces out: each sampled request's spans, queued as they end (a full queue drops spans and
//! counts them, never blocking a request) and sent by one task in batches (up to 512 spans, or
//! what came within a second) to an OpenTelemetry collector over OTLP/HTTP, JSON encoded
//! (`POST <endpoint>/v1/traces`, `Content-Type: application/json`: OTLP's JSON mapping, trace
//! and span ids in hex). Written by hand: the JSON is a few fields, and the OpenTelemetry SDK
//! crates would add their own runtime, batching and protobuf stack for what this does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use modelmux_context::{RequestTrace, SpanData, SpanSink, TraceParent, to_hex};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Spans queued at most; past it spans are dropped (and counted).
const QUEUE: usize = 8192;
/// Spans per request to the collector at most.
const BATCH: usize = 512;
/// How long spans wait for their batch to fill.
const LINGER: Duration = Duration::from_secs(1);

/// Where and how much to trace.
#[derive(Debug, Clone)]
pub struct TracingOptions {
    /// The collector's OTLP/HTTP endpoint, `http://host:port` (`/v1/traces` is added unless
    /// the path already ends with it).
    pub otlp_endpoint: String,
    /// Share of requests without a sampled `traceparent` that are traced (0 to 1); a request
    /// whose caller sampled it is always traced, one whose caller did not never is.
    pub sample_ratio: f64,
    /// `service.name` of the spans.
    pub service_name: String,
    /// This node's id (a `service.instance.id` resource attribute), in a cluster.
    pub node: Option<String>,
}

/// The server's tracer: decides which requests are traced and exports their spans.
pub(crate) struct Tracer {
    ratio: f64,
    exporter: Arc<Exporter>,
}

impl Tracer {
    /// Starts the exporting task (on the current runtime).
    pub(crate) fn start(options: &TracingOptions) -> Result<Self, String> {
        let (addr, path) = endpoint(&options.otlp_endpoint)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let exporter = Arc::new(Exporter {
            tx,
            dropped: AtomicU64::new(0),
        });
        let resource = resource(options);
        tokio::spawn(send_batches(rx, addr, path, resource));
        Ok(Self {
            ratio: options.sample_ratio.clamp(0.0, 1.0),
            exporter,
        })
    }

    /// The trace of a request whose `traceparent` header is `header`, if it is sampled.
    pub(crate) fn begin(&self, header: Option<&http::HeaderValue>) -> Option<RequestTrace> {
        let parent = header
            .and_then(|h| h.to_str().ok())
            .and_then(TraceParent::parse);
        let sampled = parent.map_or_else(|| modelmux_context::sample(self.ratio), |p| p.sampled);
        sampled.then(|| RequestTrace::new(parent, self.exporter.clone()))
    }
}

struct Exporter {
    tx: mpsc::Sender<SpanData>,
    dropped: AtomicU64,
}

impl SpanSink for Exporter {
    fn export(&self, span: SpanData) {
        if self.tx.try_send(span).is_err() {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped,
                    "trace spans dropped: the collector does not keep up"
                );
            }
        }
    }
}

/// `http://host:port[/path]` → the address and the request path.
fn endpoint(url: &str) -> Result<(SocketAddr, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("tracing.otlp_endpoint {url:?}: must be http://host:port"))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let addr = std::net::ToSocketAddrs::to_socket_addrs(authority)
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("tracing.otlp_endpoint {url:?}: cannot resolve {authority:?}"))?;
    let path = format!("/{}", path.trim_end_matches('/'));
    let path = if path.ends_with("/v1/traces") {
        path
    } else {
        format!("{}/v1/traces", path.trim_end_matches('/'))
    };
    Ok((addr, path))
}

fn attribute(key: &str, value: &str) -> Value {
    json!({"key": key, "value": {"stringValue": value}})
}

fn resource(options: &TracingOptions) -> Value {
    let mut attributes = vec![attribute("service.name", &options.service_name)];
    if let Some(node) = &options.node {
        attributes.push(attribute("service.instance.id", node));
    }
    json!({ "attributes": attributes })
}

fn span_json(s: &SpanData) -> Value {
    let mut span = json!({
        "traceId": to_hex(&s.trace_id),
        "spanId": to_hex(&s.span_id),
        "name": s.name,
        // SERVER for the ingress, INTERNAL for the rest.
        "kind": if s.server { 2 } else { 1 },
        "startTimeUnixNano": s.start_unix_nanos.to_string(),
        "endTimeUnixNano": s.end_unix_nanos.to_string(),
        "attributes": s.attributes.iter().map(|(k, v)| attribute(k, v)).collect::<Vec<_>>(),
        "status": {"code": if s.error { 2 } else { 0 }},
    });
    if let Some(parent) = &s.parent_span_id {
        span["parentSpanId"] = json!(to_hex(parent));
    }
    span
}

/// Collects spans into batches and posts them, until every sender is gone.
async fn send_batches(
    mut rx: mpsc::Receiver<SpanData>,
    addr: SocketAddr,
    path: String,
    resource: Value,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(span)) => batch.push(span),
                Ok(None) | Err(_) => break,
            }
        }
        let body = json!({"resourceSpans": [{
            "resource": resource,
            "scopeSpans": [{
                "scope": {"name": "modelmux", "version": env!("CARGO_PKG_VERSION")},
                "spans": batch.iter().map(span_json).collect::<Vec<_>>(),
            }],
        }]});
        let spans = batch.len();
        batch.clear();
        if let Err(e) = post(addr, &path, body.to_string()).await {
            tracing::warn!(
                spans,
                "sending spans to the OTLP collector at {addr}{path}: {e}"
            );
        }
    }
}

async fn post(addr: SocketAddr, path: &str, body: String) -> Result<(), String> {
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| "connecting timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let request = http::Request::post(path)
        .header(http::header::HOST, addr.to_string())
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request))
        .await
        .map_err(|_| "the collector did not answer in 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let _ = response.into_body().collect().await;
    if status.is_success() {
        Ok(())
    } else {
        Err(format!("the collector answered {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_get_the_traces_path() {
        let (addr, path) = endpoint("http://127.0.0.1:4318").unwrap();
        assert_eq!((addr.port(), path.as_str()), (4318, "/v1/traces"));
        assert_eq!(endpoint("http://127.0.0.1:4318/").unwrap().1, "/v1/traces");
        assert_eq!(
            endpoint("http://127.0.0.1:4318/otlp/v1/traces").unwrap().1,
            "/otlp/v1/traces"
        );
        assert!(endpoint("https://x:1").is_err());
    }
}
