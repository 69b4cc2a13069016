//! `tracing`: where a server sends its requests' spans, and how many it traces.

use serde::Deserialize;

/// `tracing`: W3C `traceparent` accepted, propagated (handles, cluster forwards) and
/// returned; spans (ingress, queue wait, model load, inference, forward) sent over OTLP/HTTP.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP endpoint, `http://host:4318`.
    pub otlp_endpoint: String,
    /// Share of requests traced when the caller did not decide (default 1).
    #[serde(default = "default_sample_ratio")]
    pub sample_ratio: f64,
    /// The spans' `service.name` (default `modelmux`).
    #[serde(default = "default_service_name")]
    pub service_name: String,
}

fn default_sample_ratio() -> f64 {
    1.0
}

fn default_service_name() -> String {
    "modelmux".into()
}
