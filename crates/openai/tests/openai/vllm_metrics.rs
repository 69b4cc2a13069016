//! The LLM figures under vLLM's metric names, with vLLM's labels, during and after traffic on
//! adapters: what gateways and autoscalers built for vLLM read.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use serde_json::json;

/// The labels of the one `vllm:lora_requests_info` sample, and its value.
fn lora_info(text: &str) -> (String, f64) {
    let line = text
        .lines()
        .find(|l| l.starts_with("vllm:lora_requests_info{"))
        .unwrap_or_else(|| panic!("no vllm:lora_requests_info in {text}"));
    let (labels, value) = line.rsplit_once(' ').unwrap();
    (labels.to_owned(), value.parse().unwrap())
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_series_follow_requests_on_adapters() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    // Before any request: the series exist, at zero, labelled with the served model's name.
    let text = metrics(addr).await;
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_success_total",
    ] {
        assert_eq!(metric(&text, name), 0.0, "{name}: {text}");
        let line = text.lines().find(|l| l.starts_with(name)).unwrap();
        assert!(line.contains("model_name=\"smollm2\""), "{line}");
    }
    assert!(text.contains("# TYPE vllm:time_to_first_token_seconds histogram"));
    assert!(text.contains("# TYPE vllm:request_success_total counter"));
    let (labels, _) = lora_info(&text);
    assert!(labels.contains("running_lora_adapters=\"\""), "{labels}");
    assert!(labels.contains("max_lora=\"8\""), "{labels}");

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
    let (labels, scraped) = lora_info(&text);
    assert!(
        labels.contains("waiting_lora_adapters=\"pirate,poet\""),
        "{labels}"
    );
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
        lora_info(t)
            .0
            .contains("running_lora_adapters=\"pirate,poet\"")
            && metric(t, "vllm:num_requests_running") == 2.0
            && metric(t, "vllm:kv_cache_usage_perc") > 0.0
    })
    .await;
    for r in requests {
        assert_eq!(r.await.unwrap().status, 200);
    }
    let text = until(addr, "both finished", |t| {
        metric(t, "vllm:num_requests_running") == 0.0
    })
    .await;
    assert_eq!(metric(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(metric(&text, "vllm:kv_cache_usage_perc"), 0.0);
    assert_eq!(metric(&text, "vllm:generation_tokens_total"), 96.0);
    assert!(metric(&text, "vllm:prompt_tokens_total") > 10.0, "{text}");
    // Every prompt was looked up in the prefix cache (vLLM's counters, in tokens).
    assert!(
        metric(&text, "vllm:prefix_cache_queries_total") > 10.0,
        "{text}"
    );
    for name in [
        "vllm:time_to_first_token_seconds_count",
        "vllm:time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ] {
        assert_eq!(metric(&text, name), 2.0, "{name}");
    }
    let length = text
        .lines()
        .find(|l| {
            l.starts_with("vllm:request_success_total{") && l.contains("finished_reason=\"length\"")
        })
        .unwrap();
    assert!(length.ends_with(" 2"), "{length}");
    let (labels, _) = lora_info(&text);
    assert!(
        labels.contains("running_lora_adapters=\"\"")
            && labels.contains("waiting_lora_adapters=\"\""),
        "{labels}"
    );
    // The adapters' residency, under modelmux's names.
    for adapter in ["pirate", "poet"] {
        let loaded = format!("model=\"{adapter}\"");
        for name in ["modelmux_model_pinned{", "modelmux_model_resident_bytes{"] {
            assert!(
                text.lines()
                    .any(|l| l.starts_with(name) && l.contains(&loaded)),
                "{name} {adapter}: {text}"
            );
        }
    }
    server.shutdown().await;
}
