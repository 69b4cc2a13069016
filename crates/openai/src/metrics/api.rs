//! Requests by the API they came in through (`modelmux_api_requests_total{api, status}`):
//! the Responses and Messages APIs translate into chats, so the LLM deployment's own counts
//! cannot tell them apart; the ingress counts each request once, by its endpoint.

use std::sync::atomic::{AtomicU64, Ordering};

use modelmux_serve::{MetricFamily, MetricKind, MetricSample, MetricValue, MetricsSource};

use crate::call::Op;
use crate::params::Endpoint;

/// The APIs, as the `api` label names them.
const APIS: [&str; 10] = [
    "chat_completions",
    "completions",
    "responses",
    "messages",
    "embeddings",
    "tokenize",
    "score",
    "models",
    "adapters",
    "responses_store",
];
/// Status classes counted.
const CLASSES: [&str; 3] = ["2xx", "4xx", "5xx"];

/// The ingress's counts by API and status class.
#[derive(Default)]
pub(crate) struct ApiMetrics {
    counts: [[AtomicU64; CLASSES.len()]; APIS.len()],
}

/// The `api` label of an endpoint.
fn api_of(op: Op) -> usize {
    match op {
        Op::Generate(Endpoint::Chat) => 0,
        Op::Generate(Endpoint::Completion) => 1,
        Op::Responses => 2,
        Op::Messages | Op::CountTokens => 3,
        Op::Embeddings => 4,
        Op::Tokenize | Op::Detokenize => 5,
        Op::Score | Op::Rerank => 6,
        Op::Models => 7,
        Op::LoadAdapter | Op::UnloadAdapter => 8,
        Op::StoredResponse | Op::DeleteResponse | Op::InputItems => 9,
    }
}

impl ApiMetrics {
    /// Counts one request to `op` answered with `status`.
    pub(crate) fn count(&self, op: Op, status: http::StatusCode) {
        let class = if status.is_server_error() {
            2
        } else if status.is_client_error() {
            1
        } else {
            0
        };
        self.counts[api_of(op)][class].fetch_add(1, Ordering::Relaxed);
    }
}

impl MetricsSource for ApiMetrics {
    fn collect(&self) -> Vec<MetricFamily> {
        let samples = APIS
            .iter()
            .enumerate()
            .flat_map(|(a, api)| {
                CLASSES.iter().enumerate().map(move |(c, class)| MetricSample {
                    labels: vec![("api", (*api).to_owned()), ("status", (*class).to_owned())],
                    value: MetricValue::Number(self.counts[a][c].load(Ordering::Relaxed) as f64),
                })
            })
            .collect();
        vec![MetricFamily {
            name: "modelmux_api_requests_total",
            help: "Requests to the OpenAI ingress by the API they came in through (chat_completions, responses, messages, ...) and status class.",
            kind: MetricKind::Counter,
            samples,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_api_is_counted_under_its_own_label() {
        let m = ApiMetrics::default();
        m.count(Op::Responses, http::StatusCode::OK);
        m.count(Op::CountTokens, http::StatusCode::BAD_REQUEST);
        m.count(Op::Messages, http::StatusCode::OK);
        let families = m.collect();
        let value = |api: &str, status: &str| {
            families[0]
                .samples
                .iter()
                .find(|s| s.labels == [("api", api.to_owned()), ("status", status.to_owned())])
                .map(|s| match s.value {
                    MetricValue::Number(v) => v,
                    _ => panic!("a counter"),
                })
                .unwrap()
        };
        assert_eq!(value("responses", "2xx"), 1.0);
        assert_eq!(value("messages", "2xx"), 1.0);
        assert_eq!(value("messages", "4xx"), 1.0);
        assert_eq!(value("chat_completions", "2xx"), 0.0);
    }
}
