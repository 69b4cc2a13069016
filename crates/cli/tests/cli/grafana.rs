//! The operator's files in `deploy/` against the real thing: Debian's Prometheus (started here
//! on a free loopback port, with `deploy/prometheus/alerts.yml` as its rule file) scrapes a
//! real `modelmux serve` (synthetic models and SmolLM2 with adapters) under traffic; every
//! query of every panel of `deploy/grafana/*.json`, and the signal of every alert rule, returns
//! data through Prometheus' HTTP API, and the rules load (`promtool check rules`) and evaluate
//! without error; the alerts whose conditions the traffic (and a second target that is down)
//! makes true go active, and the others stay quiet. Without Prometheus the test fails, saying so.

use crate::common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use common::*;
use serde_json::Value;

fn deploy(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy")).join(path)
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with ./scripts/test, which sets it up")
    })
}

/// A loopback address nothing listens on: a node that is down.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// Prometheus scraping `target` (and a node that is down) every 200 ms with the repository's
/// alert rules; killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let binary =
            std::env::var("MODELMUX_TEST_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: 200ms, scrape_timeout: 200ms, evaluation_interval: 200ms}}\n\
                 rule_files: ['{}']\n\
                 scrape_configs:\n  - job_name: modelmux\n    static_configs: [{{targets: ['{}', '{}']}}]\n",
                deploy("prometheus/alerts.yml").display(),
                target.trim_start_matches("http://"),
                closed_port(),
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
        let mut p = Prometheus {
            child,
            url: format!("http://{addr}"),
            _dir: dir,
        };
        p.wait_ready();
        p
    }

    /// The alerts pending or firing: (name, the `instance` label, if any).
    fn active_alerts(&self) -> std::collections::BTreeSet<(String, String)> {
        let (status, body) = self.get("/api/v1/alerts");
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        body["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["state"] == "pending" || a["state"] == "firing")
            .map(|a| {
                let label = |k: &str| a["labels"][k].as_str().unwrap_or_default().to_owned();
                (label("alertname"), label("instance"))
            })
            .collect()
    }

    fn get(&self, path: &str) -> (u16, String) {
        send(&self.url, http::Request::get(path), Vec::new())
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("Prometheus exited at start: {status}");
            }
            let addr: SocketAddr = self.url.trim_start_matches("http://").parse().unwrap();
            if std::net::TcpStream::connect(addr).is_ok() && self.get("/-/ready").0 == 200 {
                return;
            }
            assert!(Instant::now() < deadline, "Prometheus not ready in 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The result of an instant query (an error status fails the test, naming the query).
    fn query(&self, promql: &str) -> Vec<Value> {
        let (status, body) = self.get(&format!("/api/v1/query?query={}", encode(promql)));
        assert_eq!(status, 200, "{promql}: {body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["status"], "success", "{promql}: {body}");
        body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
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

/// A panel's query as Grafana sends it with every variable at "All" and a 1-minute rate
/// interval.
fn as_sent(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("\"$app\"", "\".*\"")
        .replace("\"$deployment\"", "\".*\"")
}

/// An alert rule's signal: its expression without the final comparison with a number.
fn signal(expr: &str) -> String {
    let trimmed = expr.trim();
    for op in [" == ", " >= ", " <= ", " > ", " < ", " != "] {
        if let Some(at) = trimmed.rfind(op)
            && trimmed[at + op.len()..].trim().parse::<f64>().is_ok()
        {
            return trimmed[..at].trim().to_owned();
        }
    }
    panic!("alert expression {expr:?} is not `<signal> <op> <number>`")
}

fn config() -> String {
    format!(
        "\
http_options: {{port: 0}}
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Model
        num_replicas: 2
        max_models_per_replica: 2
        model: {{kind: synthetic, load_ms: 20, size_mb: 1, infer_ms: 1, fail_ids: [broken]}}
  - name: llm
    route_prefix: /llm
    deployments:
      - name: LLMServer
        num_replicas: 1
        model:
          kind: llm
          model_loading_config: {{model_id: smollm2, model_source: '{gguf}'}}
          lora_config: {{dynamic_lora_loading_path: '{adapters}', max_num_adapters_per_replica: 2}}
          engine_kwargs: {{max_num_seqs: 4, max_model_len: 512, kv_cache_bytes: 134217728}}
",
        gguf = env("MODELMUX_TEST_GGUF"),
        adapters = env("MODELMUX_TEST_ADAPTERS"),
    )
}

/// Traffic that moves every series: hits and misses, loads, evictions and a failing load on
/// the synthetic deployment; completions on the base model and three adapters (one more than
/// the cap, so adapters are evicted too).
fn traffic(url: &str, round: usize) {
    for i in 0..6 {
        let model = if i == 5 {
            "broken".to_owned()
        } else {
            format!("m{}", (round + i) % 4)
        };
        let _ = curl(url, &model);
    }
    for model in ["smollm2", "smollm2:pirate", "smollm2:poet", "smollm2:chef"] {
        let body = format!(
            r#"{{"model": "{model}", "prompt": "Hello", "max_tokens": 4, "temperature": 0}}"#
        );
        let request =
            http::Request::post("/llm/v1/completions").header("content-type", "application/json");
        let (status, answer) = send(url, request, body.into_bytes());
        assert_eq!(status, 200, "{answer}");
    }
}

#[test]
fn every_dashboard_query_and_alert_signal_returns_data_from_a_real_prometheus() {
    let rules = deploy("prometheus/alerts.yml");
    let promtool = Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): ./scripts/test installs Debian's prometheus")
        });
    assert!(
        promtool.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&promtool.stdout),
        String::from_utf8_lossy(&promtool.stderr)
    );

    let mut server = serve(&config());
    let prometheus = Prometheus::start(&server.url);
    // Traffic for a few seconds, so that rates over 1 minute have several samples.
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(4) {
        traffic(&server.url, round);
        round += 1;
    }

    let mut queries = Vec::new();
    for file in [
        "grafana/modelmux-multiplexing.json",
        "grafana/modelmux-llm.json",
    ] {
        let dashboard: Value =
            serde_json::from_str(&std::fs::read_to_string(deploy(file)).unwrap()).unwrap();
        let panels = dashboard["panels"].as_array().unwrap();
        assert!(panels.len() > 5, "{file}");
        for panel in panels.iter().filter(|p| p["type"] != "row") {
            let targets = panel["targets"].as_array().unwrap();
            assert!(
                !targets.is_empty(),
                "{file}: {} has no query",
                panel["title"]
            );
            for target in targets {
                let expr = target["expr"].as_str().unwrap();
                queries.push((format!("{file}: {}", panel["title"]), as_sent(expr)));
            }
        }
    }
    let text = std::fs::read_to_string(&rules).unwrap();
    let alerts: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .map(|e| (format!("alert rule {e}"), signal(e)))
        .collect();
    assert!(alerts.len() >= 5, "{alerts:?}");
    let alert_count = alerts.len();
    queries.extend(alerts);

    // Every query returns data once the scrapes have caught up (bounded wait).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut missing: Vec<&(String, String)> = queries.iter().collect();
    while !missing.is_empty() && Instant::now() < deadline {
        traffic(&server.url, round);
        round += 1;
        missing.retain(|(_, q)| prometheus.query(q).is_empty());
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(missing.is_empty(), "queries with no data: {:#?}", missing);

    // Every rule loaded, and each has been evaluated without error (health "ok").
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = prometheus.get("/api/v1/rules");
        assert_eq!(status, 200, "{body}");
        let body: Value = serde_json::from_str(&body).unwrap();
        let rules: Vec<Value> = body["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        assert_eq!(rules.len(), alert_count, "{body}");
        assert!(rules.iter().all(|r| r["health"] != "err"), "{body}");
        if rules.iter().all(|r| r["health"] == "ok") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rules never all evaluated: {body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    alerts_go_active(&prometheus, &server.url, round);
    let (exit, logs) = server.terminate();
    assert!(exit.success(), "{logs}");
}

/// Waits (bounded) until the alerts whose conditions the traffic makes true go active, and
/// checks that the others stay quiet meanwhile.
fn alerts_go_active(prometheus: &Prometheus, url: &str, mut round: usize) {
    // The alerts whose conditions the traffic makes true go pending (their `for` not yet
    // passed), thresholds and directions included: the down node, the failing load of
    // `broken`, its 5xx share of the synthetic deployment's answers. Those whose conditions
    // it never makes true (a queue of 20, a KV cache 90% full, 8 sequences waiting) stay
    // quiet.
    let want = [
        "ModelmuxNodeDown",
        "ModelmuxModelLoadsFailing",
        "ModelmuxErrorRatioHigh",
    ];
    let quiet = [
        "ModelmuxQueueGrowing",
        "ModelmuxLlmKvCacheNearlyFull",
        "ModelmuxLlmRequestsWaiting",
    ];
    let live = url.trim_start_matches("http://").to_owned();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        traffic(url, round);
        round += 1;
        let active = prometheus.active_alerts();
        for (name, instance) in &active {
            assert!(
                !quiet.contains(&name.as_str()),
                "{name} is active: {active:?}"
            );
            assert!(
                !(name == "ModelmuxNodeDown" && *instance == live),
                "the node that answers is said to be down: {active:?}"
            );
        }
        if want
            .iter()
            .all(|w| active.iter().any(|(name, _)| name == w))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "alerts never active within 60 s: want {want:?}, active {active:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}
