//! `modelmux plan` against reality: a trace replayed in real time against `modelmux serve`
//! (synthetic models with the configuration's load and inference times) and the planner's
//! prediction for the same trace and configuration agree on the hit ratio (±0.03) and the loads
//! (±10%). Three traces: Zipf over 64 ids, a day-shaped rate over 500 ids (its day shortened to
//! seconds), and the Ray peer workload's settings (`bench/ray-peer.yaml`) under an open-loop
//! Zipf(1.1) rate. Also: what the command says of bad input.

use std::time::Duration;

use crate::common::{BIN, send_async, serve};

/// A small deterministic generator (a 64-bit LCG), so each trace is the same every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    /// An index from 0 to `n - 1` with Zipf(`s`) weights.
    fn zipf(&mut self, cumulative: &[f64]) -> usize {
        let x = self.next() * cumulative[cumulative.len() - 1];
        cumulative
            .partition_point(|&c| c < x)
            .min(cumulative.len() - 1)
    }
}

fn cumulative(n: usize, s: f64) -> Vec<f64> {
    let mut total = 0.0;
    (1..=n)
        .map(|k| {
            total += 1.0 / (k as f64).powf(s);
            total
        })
        .collect()
}

/// Arrivals over `seconds` at `rate(t)` per second (a Poisson process, thinned), each naming a
/// Zipf(`s`) id of `ids`: the CSV the planner reads.
fn trace(seed: u64, seconds: f64, ids: usize, s: f64, rate: &dyn Fn(f64) -> f64) -> String {
    let weights = cumulative(ids, s);
    let peak = (0..1000)
        .map(|i| rate(seconds * f64::from(i) / 1000.0))
        .fold(0.0, f64::max);
    let mut rng = Lcg(seed);
    let (mut t, mut out) = (0.0, String::from("timestamp,model_id\n"));
    loop {
        t += -(1.0 - rng.next()).ln() / peak;
        if t >= seconds {
            return out;
        }
        if rng.next() * peak <= rate(t) {
            out.push_str(&format!("{t:.6},m{}\n", rng.zipf(&weights)));
        }
    }
}

/// Sends every request of `csv` at its time to the server at `url`, each on its own
/// connection, and waits for every answer.
fn replay_against(url: &str, csv: &str) {
    let arrivals: Vec<(f64, String)> = csv
        .lines()
        .skip(1)
        .map(|l| {
            let (t, m) = l.split_once(',').unwrap();
            (t.parse().unwrap(), m.to_string())
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let start = tokio::time::Instant::now();
        let mut sent = Vec::new();
        for (at, model) in arrivals {
            tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
            let url = url.to_string();
            sent.push(tokio::spawn(async move {
                let request =
                    http::Request::get("/").header("serve_multiplexed_model_id", model.as_str());
                let (status, _, body) = send_async(&url, request, Vec::new()).await;
                assert_eq!(status, 200, "{model}: {}", String::from_utf8_lossy(&body));
            }));
        }
        for s in sent {
            s.await.unwrap();
        }
    });
}

/// What the server counted: its caches' hit ratio and its loads.
fn measured(url: &str) -> (f64, f64) {
    let (status, text) = crate::common::send(url, http::Request::get("/metrics"), Vec::new());
    assert_eq!(status, 200);
    let m = modelmux_promtext::parse(&text).unwrap();
    let (hits, misses) = (
        m.sum("modelmux_cache_hits_total"),
        m.sum("modelmux_cache_misses_total"),
    );
    (hits / (hits + misses), m.sum("modelmux_model_loads_total"))
}

/// What the planner predicts for `csv` under `config`: its hit ratio and its loads.
fn predicted(dir: &std::path::Path, config: &str, csv: &str) -> (f64, f64) {
    let (config_path, trace_path) = (dir.join("config.yaml"), dir.join("trace.csv"));
    std::fs::write(&config_path, config).unwrap();
    std::fs::write(&trace_path, csv).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("plan")
        .arg(&trace_path)
        .arg("--config")
        .arg(&config_path)
        .arg("--json")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v["report"];
    (
        r["hit_ratio"].as_f64().unwrap(),
        r["loads"].as_f64().unwrap(),
    )
}

fn config(deployment: &str) -> String {
    format!(
        "http_options: {{port: 0}}\napplications:\n  - name: default\n    deployments:\n{deployment}"
    )
}

#[test]
fn the_planner_predicts_a_real_servers_hit_ratio_and_loads_on_three_traces() {
    let day = |t: f64| 40.0 + 60.0 * (std::f64::consts::PI * t / 12.0).sin().powi(2);
    let cases: [(&str, String, String); 3] = [
        (
            "Zipf(1.0) over 64 ids, 60/s",
            config(
                "      - name: Model\n        num_replicas: 2\n        max_models_per_replica: 6\n        eviction_policy: lru\n        model: {kind: synthetic, load_ms: 40, infer_ms: 5}\n",
            ),
            trace(1, 12.0, 64, 1.0, &|_| 60.0),
        ),
        (
            "a day-shaped rate (40 to 100/s) over 500 ids",
            config(
                "      - name: Model\n        num_replicas: 3\n        max_models_per_replica: 24\n        model: {kind: synthetic, load_ms: 30, infer_ms: 3}\n",
            ),
            trace(2, 12.0, 500, 0.9, &day),
        ),
        (
            "the Ray peer workload's settings, Zipf(1.1) over 64 ids at 80/s",
            config(
                "      - name: Model\n        num_replicas: 4\n        max_ongoing_requests: 5\n        max_models_per_replica: 4\n        eviction_policy: lru\n        model: {kind: synthetic, load_ms: 100, infer_ms: 2}\n",
            ),
            trace(3, 12.0, 64, 1.1, &|_| 80.0),
        ),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (name, config, csv) in &cases {
        let mut server = serve(config);
        replay_against(&server.url, csv);
        let (real_hits, real_loads) = measured(&server.url);
        server.terminate();
        let (hits, loads) = predicted(dir.path(), config, csv);
        let requests = csv.lines().count() - 1;
        eprintln!(
            "{name}: {requests} requests; hit ratio {real_hits:.4} served, {hits:.4} planned; \
             loads {real_loads} served, {loads} planned"
        );
        if (hits - real_hits).abs() > 0.03 || (loads - real_loads).abs() > 0.1 * real_loads {
            failures.push(format!(
                "{name}: hit ratio {hits:.4} planned against {real_hits:.4} served (±0.03), \
                 loads {loads} against {real_loads} (±10%)"
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_malformed_line_is_named_by_its_number_and_an_empty_trace_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let run = |text: &str| {
        let path = dir.path().join("trace.csv");
        std::fs::write(&path, text).unwrap();
        let out = std::process::Command::new(BIN)
            .arg("plan")
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, said) = run("0,a\n0.5,b\nsoon,c\n");
    assert!(!ok);
    assert!(
        said.contains("line 3: timestamp: `soon` is neither seconds nor an RFC 3339 time"),
        "{said}"
    );
    let (ok, said) = run("timestamp,model_id\n");
    assert!(!ok);
    assert!(
        said.contains("the trace holds no request (read 1 lines)"),
        "{said}"
    );
}
