//! What one LLM replica adds to `/metrics`, under modelmux's names and (`vllm.rs`) under the
//! names vLLM uses, which LLM gateways and autoscalers read. Adapter loads, their latency and
//! the adapters held are the multiplexing metrics the serve layer already exports for the
//! replica's adapter cache (`modelmux_model_loads_total`, `modelmux_model_load_duration_seconds`,
//! `modelmux_models_loaded`, `modelmux_model_loaded{model=...}`, `modelmux_model_pinned`,
//! `modelmux_model_resident_bytes`). The dashboard charts the vLLM-named families this
//! source marks for it (`vllm::DASHBOARD`).

mod api;
mod vllm;

pub(crate) use api::ApiMetrics;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use modelmux_cache::DurationHistogram;
use modelmux_llm::Engine;
use modelmux_serve::{
    DashboardSeries, MetricFamily, MetricKind, MetricSample, MetricValue, MetricsSource,
};
use parking_lot::Mutex;

/// Time to first token: from 10 ms to 2 minutes.
static TTFT_BUCKETS: [f64; 14] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];
/// Time per output token: from 1 ms to 2.5 s.
static TPOT_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 2.5,
];

/// End-to-end request latency: from 50 ms to 5 minutes.
static E2E_BUCKETS: [f64; 15] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0,
];

/// One replica's LLM metrics.
pub(crate) struct LlmMetrics {
    engine: Engine,
    /// The base model's id: vLLM's `model_name` label.
    model_name: String,
    /// Adapters one replica holds at most: vLLM's `max_lora`.
    max_adapters: usize,
    ttft: DurationHistogram,
    tpot: DurationHistogram,
    e2e: DurationHistogram,
    /// Requests that reached the engine, by model (the base model's id or an adapter's, only
    /// ones that exist, so the label set is bounded by the repository).
    requests: Mutex<HashMap<String, u64>>,
    finished_stop: AtomicU64,
    finished_length: AtomicU64,
}

impl LlmMetrics {
    pub(crate) fn new(runtime: &modelmux_llm::LlmRuntime) -> Self {
        Self {
            engine: runtime.engine().clone(),
            model_name: runtime.options().model_id.clone(),
            max_adapters: runtime.options().max_adapters,
            ttft: DurationHistogram::new(&TTFT_BUCKETS),
            tpot: DurationHistogram::new(&TPOT_BUCKETS),
            e2e: DurationHistogram::new(&E2E_BUCKETS),
            requests: Mutex::default(),
            finished_stop: AtomicU64::new(0),
            finished_length: AtomicU64::new(0),
        }
    }

    /// Sequences finished so far, by OpenAI's `finish_reason`.
    fn finished_by_reason(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        [
            ("stop", &self.finished_stop),
            ("length", &self.finished_length),
        ]
        .into_iter()
        .map(|(reason, n)| (reason, n.load(Ordering::Relaxed) as f64))
    }

    pub(crate) fn request(&self, model: &str) {
        *self.requests.lock().entry(model.to_owned()).or_default() += 1;
    }

    pub(crate) fn first_token(&self, after: Duration) {
        self.ttft.observe(after);
    }

    /// A finished sequence: `decoding` is the time from its first token to its last, `total`
    /// from the request reaching the replica to its end.
    pub(crate) fn finished(
        &self,
        reason: modelmux_llm::FinishReason,
        tokens: usize,
        decoding: Duration,
        total: Duration,
    ) {
        self.e2e.observe(total);
        if tokens > 1 {
            self.tpot.observe(decoding / (tokens as u32 - 1));
        }
        match reason {
            modelmux_llm::FinishReason::Stop => &self.finished_stop,
            modelmux_llm::FinishReason::Length => &self.finished_length,
        }
        .fetch_add(1, Ordering::Relaxed);
    }
}

fn number(name: &'static str, help: &'static str, kind: MetricKind, v: u64) -> MetricFamily {
    MetricFamily::single(name, help, kind, MetricValue::Number(v as f64))
}

impl MetricsSource for LlmMetrics {
    fn dashboard(&self) -> Option<DashboardSeries> {
        Some(vllm::DASHBOARD)
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let s = self.engine.snapshot();
        let mut families = self.vllm(&s);
        let mut requests: Vec<_> = self
            .requests
            .lock()
            .iter()
            .map(|(m, n)| (m.clone(), *n))
            .collect();
        requests.sort();
        families.extend([
            MetricFamily::single(
                "modelmux_llm_time_to_first_token_seconds",
                "Time from a generation request reaching its replica to its first token.",
                MetricKind::Histogram,
                MetricValue::Histogram(self.ttft.snapshot()),
            ),
            MetricFamily::single(
                "modelmux_llm_time_per_output_token_seconds",
                "Time between output tokens of a sequence (its decoding time over its tokens after the first).",
                MetricKind::Histogram,
                MetricValue::Histogram(self.tpot.snapshot()),
            ),
            number(
                "modelmux_llm_prompt_tokens_total",
                "Prompt tokens prefilled.",
                MetricKind::Counter,
                s.prompt_tokens,
            ),
            number(
                "modelmux_llm_generation_tokens_total",
                "Tokens generated.",
                MetricKind::Counter,
                s.generated_tokens,
            ),
            number(
                "modelmux_llm_prefix_cache_queries_total",
                "Prompt tokens looked up in the prefix cache.",
                MetricKind::Counter,
                s.prefix_cache_queries,
            ),
            number(
                "modelmux_llm_prefix_cache_hits_total",
                "Prompt tokens whose KV came from the prefix cache (their prefill skipped).",
                MetricKind::Counter,
                s.prefix_cache_hits,
            ),
            number(
                "modelmux_llm_prefix_cache_bytes",
                "KV bytes the prefix cache holds, inside the KV cache budget.",
                MetricKind::Gauge,
                s.prefix_cache_bytes,
            ),
            number(
                "modelmux_llm_sequences_running",
                "Sequences in the engine's batch.",
                MetricKind::Gauge,
                s.running as u64,
            ),
            number(
                "modelmux_llm_sequences_waiting",
                "Requests waiting for room in the engine.",
                MetricKind::Gauge,
                s.waiting as u64,
            ),
            number(
                "modelmux_llm_kv_cache_used_bytes",
                "KV cache bytes reserved by live sequences.",
                MetricKind::Gauge,
                s.kv_reserved_bytes,
            ),
            number(
                "modelmux_llm_kv_cache_capacity_bytes",
                "The KV cache budget.",
                MetricKind::Gauge,
                s.kv_capacity_bytes,
            ),
            MetricFamily {
                name: "modelmux_llm_requests_finished_total",
                help: "Sequences finished, by reason (stop or length).",
                kind: MetricKind::Counter,
                samples: self
                    .finished_by_reason()
                    .map(|(reason, n)| MetricSample {
                        labels: vec![("finish_reason", reason.to_owned())],
                        value: MetricValue::Number(n),
                    })
                .collect(),
            },
            MetricFamily {
                name: "modelmux_llm_requests_total",
                help: "Generation requests that reached the engine, by model (base or adapter).",
                kind: MetricKind::Counter,
                samples: requests
                    .into_iter()
                    .map(|(model, n)| MetricSample {
                        labels: vec![("model", model)],
                        value: MetricValue::Number(n as f64),
                    })
                    .collect(),
            },
        ]);
        families
    }
}
