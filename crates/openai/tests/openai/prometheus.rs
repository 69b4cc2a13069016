//! A real Prometheus (Debian's `prometheus`, which `scripts/test` installs) scrapes an LLM
//! server during a burst of requests on adapters, and every `vllm:` series answers a PromQL
//! query with vLLM's labels and plausible values: running goes up during the burst and back to
//! 0. Without the binary the test fails, saying so (set `MODELMUX_TEST_PROMETHEUS` to one
//! elsewhere).

use crate::common;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::*;
use serde_json::{Value, json};

/// A Prometheus process scraping one target every 200 ms, killed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(target: SocketAddr) -> Prometheus {
        let binary =
            std::env::var("MODELMUX_TEST_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 200ms, scrape_timeout: 200ms}}\n\
                 scrape_configs:\n  - job_name: modelmux\n    static_configs: [{{targets: ['{target}']}}]\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let child = Command::new(&binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start Prometheus ({binary}: {e}): run the tests with ./scripts/test, \
                     which installs Debian's prometheus, or set MODELMUX_TEST_PROMETHEUS"
                )
            });
        Prometheus {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Waits (bounded) until it answers `/-/ready` (its storage is open: before that, queries
    /// get 503); fails if it exits first.
    async fn ready(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("Prometheus exited at start: {status}");
            }
            if tokio::net::TcpStream::connect(self.addr).await.is_ok()
                && get(self.addr, "/-/ready").await.status == 200
            {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Prometheus was not ready on {} within 60 s",
                self.addr
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The result vector of an instant PromQL query.
    async fn query(&self, promql: &str) -> Vec<Value> {
        let path = format!("/api/v1/query?query={}", encode(promql));
        let reply = get(self.addr, &path).await;
        assert_eq!(
            reply.status,
            200,
            "{promql}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        let body = reply.json();
        assert_eq!(body["status"], "success", "{promql}: {body}");
        body["data"]["result"].as_array().unwrap().clone()
    }

    /// Waits (bounded) until `promql` returns a sample for which `check` holds.
    async fn until(&self, promql: &str, check: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(result) =
                tokio::time::timeout(Duration::from_secs(5), self.query(promql)).await
                && let Some(found) = result.into_iter().find(&check)
            {
                return found;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{promql}: never as expected"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Percent-encodes a query parameter.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn value(sample: &Value) -> f64 {
    sample["value"][1].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reads_the_vllm_series_during_a_burst() {
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    // Starting the process is probe enough: a missing binary fails here, loudly.
    let mut prometheus = Prometheus::start(addr);
    prometheus.ready().await;
    prometheus
        .until("up{job=\"modelmux\"}", |s| value(s) == 1.0)
        .await;

    // A burst of long requests on two adapters and the base model.
    let burst: Vec<_> = [
        "smollm2:pirate",
        "smollm2:poet",
        "smollm2",
        "smollm2:pirate",
    ]
    .into_iter()
    .map(|model| {
        let mut body = chat(model, "Tell me a long story.", 160, false);
        body["ignore_eos"] = json!(true);
        tokio::spawn(async move { post(addr, "/v1/chat/completions", body).await })
    })
    .collect();
    // Running goes up while they run, and the adapters running are named.
    let running = prometheus
        .until("vllm:num_requests_running", |s| value(s) >= 2.0)
        .await;
    assert_eq!(running["metric"]["model_name"], "smollm2", "{running}");
    let info = prometheus
        .until("vllm:lora_requests_info", |s| {
            s["metric"]["running_lora_adapters"]
                .as_str()
                .is_some_and(|a| a.contains("pirate"))
        })
        .await;
    assert_eq!(info["metric"]["max_lora"], "8", "{info}");
    prometheus
        .until("vllm:kv_cache_usage_perc", |s| {
            value(s) > 0.0 && value(s) <= 1.0
        })
        .await;
    for r in burst {
        assert_eq!(r.await.unwrap().status, 200);
    }
    // And back to 0 once they are done; the counters and histograms saw all four.
    prometheus
        .until("vllm:num_requests_running", |s| value(s) == 0.0)
        .await;
    prometheus
        .until("vllm:num_requests_waiting", |s| value(s) == 0.0)
        .await;
    prometheus
        .until("vllm:generation_tokens_total", |s| value(s) == 640.0)
        .await;
    prometheus
        .until("vllm:prompt_tokens_total", |s| value(s) > 0.0)
        .await;
    prometheus
        .until(
            "vllm:request_success_total{finished_reason=\"length\"}",
            |s| value(s) == 4.0,
        )
        .await;
    for histogram in [
        "vllm:time_to_first_token_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ] {
        prometheus
            .until(&format!("{histogram}_count"), |s| value(s) == 4.0)
            .await;
        // A quantile over the buckets is a plausible duration.
        let q = prometheus
            .until(
                &format!("histogram_quantile(0.5, sum by (le) ({histogram}_bucket))"),
                |s| value(s).is_finite(),
            )
            .await;
        assert!(value(&q) > 0.0 && value(&q) < 300.0, "{histogram}: {q}");
    }
    server.shutdown().await;
}
