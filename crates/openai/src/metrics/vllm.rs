//! The replica's LLM figures under vLLM's metric names, beside `modelmux_llm_*` on the same
//! `/metrics`: what the tools people put in front of vLLM read (the Gateway API Inference
//! Extension routes LoRA traffic by `vllm:lora_requests_info`, KEDA scales on
//! `vllm:num_requests_waiting`, vLLM's Grafana dashboards chart the latency histograms).
//!
//! The names and labels follow vLLM's V1 engine: every series has `model_name` (the base
//! model's id, as vLLM's served model name); finished requests are counted by
//! `finished_reason`; `vllm:kv_cache_usage_perc` is a fraction (1 is full); the time between
//! output tokens is `vllm:time_per_output_token_seconds` (one observation per sequence: its
//! decoding time over its tokens after the first). `vllm:lora_requests_info` is a gauge whose
//! value is the time of the scrape (Unix seconds) and whose labels name the adapters running
//! and waiting, comma-separated, and `max_lora`, as vLLM sets it. The serve layer adds the
//! replica's own labels (`app`, `deployment`, `replica`).

use modelmux_llm::EngineSnapshot;
use modelmux_serve::{DashboardSeries, MetricFamily, MetricKind, MetricSample, MetricValue};

use super::LlmMetrics;

/// The families the dashboard charts for an LLM replica: vLLM's names, as below.
pub(super) const DASHBOARD: DashboardSeries = DashboardSeries {
    generation_tokens: "vllm:generation_tokens_total",
    prompt_tokens: "vllm:prompt_tokens_total",
    running: "vllm:num_requests_running",
    waiting: "vllm:num_requests_waiting",
    cache_usage: "vllm:kv_cache_usage_perc",
    time_to_first_token: "vllm:time_to_first_token_seconds",
};

impl LlmMetrics {
    /// The vLLM-named families, from `s` and this replica's histograms and counters.
    pub(super) fn vllm(&self, s: &EngineSnapshot) -> Vec<MetricFamily> {
        let model = || vec![("model_name", self.model_name.clone())];
        let one = |name, help, kind, value: f64| MetricFamily {
            name,
            help,
            kind,
            samples: vec![MetricSample {
                labels: model(),
                value: MetricValue::Number(value),
            }],
        };
        let histogram = |name, help, h: &modelmux_cache::DurationHistogram| MetricFamily {
            name,
            help,
            kind: MetricKind::Histogram,
            samples: vec![MetricSample {
                labels: model(),
                value: MetricValue::Histogram(h.snapshot()),
            }],
        };
        let usage = if s.kv_capacity_bytes == 0 {
            0.0
        } else {
            s.kv_reserved_bytes as f64 / s.kv_capacity_bytes as f64
        };
        let adapters = self.engine.adapters_in_use();
        let scraped = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        vec![
            one(
                DASHBOARD.running,
                "Requests in the engine's batch (vLLM's name).",
                MetricKind::Gauge,
                s.running as f64,
            ),
            one(
                DASHBOARD.waiting,
                "Requests waiting for room in the engine (vLLM's name).",
                MetricKind::Gauge,
                s.waiting as f64,
            ),
            one(
                DASHBOARD.cache_usage,
                "Share of the KV cache budget in use, 1 being full (vLLM's name).",
                MetricKind::Gauge,
                usage,
            ),
            one(
                DASHBOARD.prompt_tokens,
                "Prompt tokens prefilled (vLLM's name).",
                MetricKind::Counter,
                s.prompt_tokens as f64,
            ),
            one(
                "vllm:prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache (vLLM's name).",
                MetricKind::Counter,
                s.prefix_cache_queries as f64,
            ),
            one(
                "vllm:prefix_cache_hits_total",
                "Prompt tokens found in the prefix cache (vLLM's name).",
                MetricKind::Counter,
                s.prefix_cache_hits as f64,
            ),
            one(
                DASHBOARD.generation_tokens,
                "Tokens generated (vLLM's name).",
                MetricKind::Counter,
                s.generated_tokens as f64,
            ),
            histogram(
                DASHBOARD.time_to_first_token,
                "Time from a request reaching its replica to its first token (vLLM's name).",
                &self.ttft,
            ),
            histogram(
                "vllm:time_per_output_token_seconds",
                "Time between output tokens, one observation per sequence (vLLM's name).",
                &self.tpot,
            ),
            histogram(
                "vllm:e2e_request_latency_seconds",
                "Time from a request reaching its replica to its last token (vLLM's name).",
                &self.e2e,
            ),
            MetricFamily {
                name: "vllm:request_success_total",
                help: "Requests finished, by finished_reason (vLLM's name).",
                kind: MetricKind::Counter,
                samples: self
                    .finished_by_reason()
                    .map(|(reason, n)| MetricSample {
                        labels: vec![
                            ("model_name", self.model_name.clone()),
                            ("finished_reason", reason.to_owned()),
                        ],
                        value: MetricValue::Number(n),
                    })
                    .collect(),
            },
            MetricFamily {
                name: "vllm:lora_requests_info",
                help: "Adapters of the running and waiting requests; the value is the scrape's \
                       time (vLLM's name and convention).",
                kind: MetricKind::Gauge,
                samples: vec![MetricSample {
                    labels: vec![
                        ("running_lora_adapters", adapters.running.join(",")),
                        ("waiting_lora_adapters", adapters.waiting.join(",")),
                        ("max_lora", self.max_adapters.to_string()),
                    ],
                    value: MetricValue::Number(scraped),
                }],
            },
        ]
    }
}
