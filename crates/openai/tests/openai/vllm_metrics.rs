//! The LLM figures under vLLM's metric names, with vLLM's labels, during and after traffic on
//! adapters: what gateways and autoscalers built for vLLM read.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::json;

/// The one `vllm:lora_requests_info` sample.
fn lora_info(text: &str) -> modelmux_promtext::Sample {
    let page = page(text);
    let mut found = page.samples("vllm:lora_requests_info");
    let info = found
        .next()
        .unwrap_or_else(|| panic!("no vllm:lora_requests_info in {text}"))
        .clone();
    assert!(found.next().is_none(), "one replica, one sample: {text}");
    info
}

/// Polls `/metrics` until `check` holds; panics with the last page after 30 s.
async fn until(addr: SocketAddr, what: &str, check: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let text = metrics(addr).await;
        if check(&text) {
            return text;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The base model's name, as vLLM labels every series.
const MODEL: [(&str, &str); 1] = [("model_name", "smollm2")];

/// Before any request: every series exists, at zero, labelled with the served model's name.
fn check_untouched(text: &str) {
    let m = page(text);
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ] {
        assert_eq!(m.value(name, &MODEL), Some(0.0), "{name}: {text}");
    }
    for reason in ["stop", "length"] {
        let labels = [MODEL[0], ("finished_reason", reason)];
        assert_eq!(m.value("vllm:request_success_total", &labels), Some(0.0));
    }
    for (family, kind) in [
        ("vllm:time_to_first_token_seconds", "histogram"),
        ("vllm:request_success_total", "counter"),
        ("vllm:num_requests_running", "gauge"),
        ("vllm:lora_requests_info", "gauge"),
    ] {
        assert_eq!(m.kind(family), Some(kind), "{family}");
    }
    let info = lora_info(text);
    assert_eq!(info.label("running_lora_adapters"), Some(""));
    assert_eq!(info.label("waiting_lora_adapters"), Some(""));
    assert_eq!(info.label("max_lora"), Some("8"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_series_follow_requests_on_adapters() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    check_untouched(&metrics(addr).await);

    // Paused, two requests on two adapters wait: counted waiting, their adapters named.
    assert_eq!(control(addr, "pause").await.status, 200);
    let mut requests = Vec::new();
    for adapter in ["pirate", "poet"] {
        let mut body = chat(&format!("smollm2:{adapter}"), "Tell me a story.", 48, false);
        body["ignore_eos"] = json!(true);
        requests.push(tokio::spawn(async move {
            post(addr, "/v1/chat/completions", body).await
        }));
    }
    let text = until(addr, "two requests waiting", |t| {
        metric(t, "vllm:num_requests_waiting") == 2.0
    })
    .await;
    assert_eq!(metric(&text, "vllm:num_requests_running"), 0.0);
    let info = lora_info(&text);
    assert_eq!(info.label("waiting_lora_adapters"), Some("pirate,poet"));
    assert_eq!(info.label("running_lora_adapters"), Some(""));
    let scraped = info.value;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(
        (now - scraped).abs() < 60.0,
        "the value is the scrape's time: {scraped}"
    );

    // Resumed: they run (seen in the adapters running), then finish by length.
    assert_eq!(control(addr, "resume").await.status, 200);
    until(addr, "the adapters running", |t| {
        lora_info(t).label("running_lora_adapters") == Some("pirate,poet")
            && metric(t, "vllm:num_requests_running") == 2.0
            && metric(t, "vllm:kv_cache_usage_perc") > 0.0
    })
    .await;
    let mut prompt_tokens = 0;
    for r in requests {
        let reply = r.await.unwrap();
        assert_eq!(reply.status, 200);
        let usage = &reply.json()["usage"];
        assert_eq!(usage["completion_tokens"], 48, "{usage}");
        prompt_tokens += usage["prompt_tokens"].as_u64().unwrap();
    }
    let text = until(addr, "both finished", |t| {
        metric(t, "vllm:num_requests_running") == 0.0
    })
    .await;
    check_finished(&text, prompt_tokens);
    server.shutdown().await;
}

/// After both requests (48 tokens each, `prompt_tokens` between them): every figure exactly.
fn check_finished(text: &str, prompt_tokens: u64) {
    let m = page(text);
    let one = |name: &str| {
        m.value(name, &MODEL)
            .unwrap_or_else(|| panic!("{name}: {text}"))
    };
    assert_eq!(one("vllm:num_requests_waiting"), 0.0);
    assert_eq!(one("vllm:kv_cache_usage_perc"), 0.0);
    // Exactly what the two answers say they took: 48 tokens each, and their prompts.
    assert_eq!(one("vllm:generation_tokens_total"), 96.0);
    assert_eq!(
        one("vllm:prompt_tokens_total"),
        prompt_tokens as f64,
        "{text}"
    );
    // Every prompt token was looked up in the prefix cache (vLLM's counters, in tokens), and
    // the figures under both names are the engine's same counters.
    assert_eq!(one("vllm:prefix_cache_queries_total"), prompt_tokens as f64);
    for (vllm, ours) in [
        (
            "vllm:prompt_tokens_total",
            "modelmux_llm_prompt_tokens_total",
        ),
        (
            "vllm:generation_tokens_total",
            "modelmux_llm_generation_tokens_total",
        ),
        (
            "vllm:prefix_cache_queries_total",
            "modelmux_llm_prefix_cache_queries_total",
        ),
        (
            "vllm:prefix_cache_hits_total",
            "modelmux_llm_prefix_cache_hits_total",
        ),
    ] {
        assert_eq!(one(vllm), m.sum(ours), "{vllm} against {ours}");
    }
    for name in [
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        let h = m.histogram(name, &MODEL).unwrap();
        assert_eq!(h.count, 2.0, "{name}");
        assert_eq!(h.buckets.last(), Some(&(f64::INFINITY, 2.0)), "{name}");
    }
    for (reason, n) in [("length", 2.0), ("stop", 0.0)] {
        let labels = [MODEL[0], ("finished_reason", reason)];
        assert_eq!(
            m.value("vllm:request_success_total", &labels),
            Some(n),
            "{reason}"
        );
    }
    let info = lora_info(text);
    assert_eq!(info.label("running_lora_adapters"), Some(""));
    assert_eq!(info.label("waiting_lora_adapters"), Some(""));
    // The adapters' residency, under modelmux's names: held, not pinned, of a known size.
    for adapter in ["pirate", "poet"] {
        let held = [("model", adapter)];
        assert_eq!(
            m.value("modelmux_model_loaded", &held),
            Some(1.0),
            "{adapter}"
        );
        assert_eq!(
            m.value("modelmux_model_pinned", &held),
            Some(0.0),
            "{adapter}"
        );
        let bytes = m.value("modelmux_model_resident_bytes", &held).unwrap();
        assert!(bytes > 0.0, "{adapter}: {bytes}");
    }
    assert_eq!(m.sum("modelmux_llm_requests_total"), 2.0, "{text}");
}
