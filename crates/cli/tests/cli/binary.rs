//! The `modelmux` binary as a user runs it: a YAML file, the guide's request, the log lines,
//! `status`, `bench`, a bad configuration, and SIGTERM.

use crate::common;

use std::process::Command;

use common::*;

const CONFIG: &str = "\
http_options:
  host: 127.0.0.1
  port: 0
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Model
        num_replicas: 2
        max_models_per_replica: 2
        model:
          kind: synthetic
          load_ms: 50
          size_mb: 1
          fail_ids: [broken]
";

#[test]
fn serve_answer_report_benchmark_and_stop_on_sigterm() {
    let mut server = serve(CONFIG);
    let (status, body) = curl(&server.url, "1");
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains(r#""model_id":"1""#) && body.contains("checksum"),
        "{body}"
    );
    assert_eq!(curl(&server.url, "1").0, 200);
    let (status, body) = curl(&server.url, "broken");
    assert_eq!(status, 500);
    assert!(body.contains("configured to fail"), "{body}");

    // The server's URL from the environment, as a shell session would set it once (and the
    // admin token from the file the server wrote, where its user's commands look).
    let status = Command::new(BIN)
        .arg("status")
        .env("MODELMUX_URL", &server.url)
        .env("MODELMUX_RUNTIME_DIR", runtime_dir())
        .output()
        .unwrap();
    assert!(status.status.success());
    let table = String::from_utf8_lossy(&status.stdout);
    assert!(
        table.contains("Model#") && table.contains(" 1 1.0 "),
        "{table}"
    );

    let bench = Command::new(BIN)
        .args([
            "bench",
            "--url",
            &server.url,
            "--models",
            "8",
            "--zipf",
            "1.1",
            "--concurrency",
            "4",
            "--duration",
            "1",
            "--lru-slots",
            "4",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        bench.status.success(),
        "{}",
        String::from_utf8_lossy(&bench.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&bench.stdout).unwrap();
    // Some requests, whatever the machine's load: this checks the report, not the speed.
    assert!(report["requests"].as_u64().unwrap() >= 8, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert!(
        report["server"]["loads"].as_f64().unwrap() >= 1.0,
        "{report}"
    );
    assert!(
        report["global_lru"]["loads"].as_u64().unwrap() >= 1,
        "{report}"
    );

    // SIGTERM: a graceful stop that unloads the models.
    let (exit, logs) = server.terminate();
    assert!(exit.success());
    assert!(logs.contains("Loading model '1'."), "{logs}");
    assert!(logs.contains("Loaded model '1' in"), "{logs}");
    assert!(logs.contains("Unloading model '1'."), "{logs}");
    // Unloads say why: the bench's eight models on 2 x 2 slots evicted some for room, and
    // SIGTERM unloaded the rest.
    assert!(logs.contains("reason=\"capacity\""), "{logs}");
    assert!(logs.contains("reason=\"shutdown\""), "{logs}");
    assert!(
        logs.contains("modelmux::access") && logs.contains("status=200"),
        "one line per request: {logs}"
    );
}

#[test]
fn a_bad_configuration_is_refused_with_the_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(&path, CONFIG.replace("num_replicas: 2", "num_replicas: -3")).unwrap();
    let out = Command::new(BIN)
        .args(["serve", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("num_replicas") && err.contains("line 9"),
        "{err}"
    );

    let out = Command::new(BIN)
        .args(["serve", "--check"])
        .output()
        .unwrap();
    assert!(out.status.success(), "the built-in demo is valid");
    let out = Command::new(BIN)
        .args(["serve", "/no/such/file.yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /no/such/file.yaml"));
}

#[test]
fn logs_are_json_lines_with_a_flag() {
    let mut server = serve_with(CONFIG, &["--log-format", "json"]);
    assert_eq!(curl(&server.url, "7").0, 200);
    let (_, logs) = server.terminate();
    let lines: Vec<serde_json::Value> = logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access = lines
        .iter()
        .find(|l| l["target"] == "modelmux::access")
        .unwrap_or_else(|| panic!("no access line in {logs}"));
    assert_eq!(access["fields"]["model_id"], "7");
    assert_eq!(access["fields"]["status"], 200);
    assert!(
        access["fields"]["request_id"]
            .as_str()
            .is_some_and(|r| r.len() == 16)
    );
    assert!(
        access["fields"]["replica"]
            .as_str()
            .unwrap()
            .starts_with("Model#")
    );
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "Loading model '7'."),
        "{logs}"
    );
    // The access line says what was asked (method and path), and durations are rounded.
    assert_eq!(access["fields"]["method"], "GET");
    assert_eq!(access["fields"]["path"], "/");
    let loaded = lines
        .iter()
        .find(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Loaded model '7'"))
        })
        .unwrap_or_else(|| panic!("no Loaded line in {logs}"));
    let ms = loaded["fields"]["duration_ms"].as_f64().unwrap();
    assert!(
        ((ms * 100.0).round() - ms * 100.0).abs() < 1e-6,
        "duration_ms {ms} is not rounded to 0.01 ms"
    );
    // An unload says why: here, the server shutting down.
    assert!(
        lines
            .iter()
            .any(|l| l["fields"]["message"] == "Unloading model '7'."
                && l["fields"]["reason"] == "shutdown"),
        "{logs}"
    );
}

const DEMO_MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/models");

/// Checks `server` answers every demo model as numpy computed when the models were made.
fn check_demo_answers(server: &Running) {
    let mut ids: Vec<String> = std::fs::read_dir(DEMO_MODELS)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("customer-"))
        .collect();
    ids.sort();
    assert_eq!(ids.len(), 8);
    for id in &ids {
        let reference: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(format!("{DEMO_MODELS}/{id}/reference.json")).unwrap(),
        )
        .unwrap();
        let request = serde_json::json!({"inputs": reference["inputs"]}).to_string();
        let (status, body) = post(&server.url, id, &request);
        assert_eq!(status, 200, "{id}: {body}");
        let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["model_id"], id.as_str());
        let want = reference["outputs"]["probabilities"].as_array().unwrap();
        let got = answer["outputs"]["probabilities"].as_array().unwrap();
        assert_eq!(want.len(), got.len());
        for (w, g) in want.iter().zip(got) {
            for (w, g) in w.as_array().unwrap().iter().zip(g.as_array().unwrap()) {
                let (w, g) = (w.as_f64().unwrap(), g.as_f64().unwrap());
                assert!(
                    (w - g).abs() <= 1e-5 + 1e-4 * w.abs(),
                    "{id}: numpy {w}, served {g}"
                );
            }
        }
    }
}

#[test]
fn serve_with_no_configuration_serves_the_demo_onnx_models() {
    let mut server = start(&["serve", "--port", "0"]);
    check_demo_answers(&server);
    let (status, body) = post(&server.url, "customer-1", r#"{"inputs": [[1, 2, 3]]}"#);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("expects shape [N, 4]"), "{body}");
    let (status, body) = post(&server.url, "customer-99", r#"{"inputs": [[1, 2, 3, 4]]}"#);
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("model 'customer-99' not found in builtin://demo"),
        "{body}"
    );
    let (status, logs) = server.terminate();
    assert!(status.success(), "{logs}");
    // Two replicas of at most three models each: serving eight models evicted some.
    assert!(logs.contains("Unloading model"), "{logs}");
}

#[test]
fn serves_the_demo_models_from_s3_through_the_disk_cache() {
    let endpoint = std::env::var("MODELMUX_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "MODELMUX_TEST_S3_ENDPOINT is not set: this test needs an S3-compatible server; \
             ./scripts/test starts one (moto) and sets it"
        )
    });
    let bucket = format!("binary-{}", std::process::id());
    s3_put(&endpoint, &format!("/{bucket}"), Vec::new());
    for entry in std::fs::read_dir(DEMO_MODELS).unwrap() {
        let entry = entry.unwrap();
        if entry.path().join("model.onnx").exists() {
            let id = entry.file_name().into_string().unwrap();
            let bytes = std::fs::read(entry.path().join("model.onnx")).unwrap();
            s3_put(
                &endpoint,
                &format!("/{bucket}/models/{id}/model.onnx"),
                bytes,
            );
        }
    }
    let cache = tempfile::tempdir().unwrap();
    let config = format!(
        "\
http_options: {{port: 0}}
disk_cache:
  path: {cache}
  max_bytes: 100000
applications:
  - name: default
    deployments:
      - name: Classifier
        num_replicas: 2
        max_models_per_replica: 3
        model:
          kind: onnx
          repository: s3://{bucket}/models
          options:
            endpoint: {endpoint}
            allow_http: 'true'
            region: us-east-1
            access_key_id: test
            secret_access_key: test
",
        cache = cache.path().join("c").display()
    );
    let mut server = serve(&config);
    check_demo_answers(&server);
    let (status, body) = post(&server.url, "customer-42", r#"{"inputs": [[1, 2, 3, 4]]}"#);
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains(&format!(
            "model 'customer-42' not found in s3://{bucket}/models"
        )),
        "{body}"
    );
    // Each model was downloaded once (the disk cache holds all eight), however often the
    // replicas load it.
    check_demo_answers(&server);
    let (status, logs) = server.terminate();
    assert!(status.success(), "{logs}");
    assert_eq!(logs.matches("Downloaded model file").count(), 8, "{logs}");
    // A new server over the same cache directory finds every model there: it serves them all
    // again and downloads none.
    let mut server = serve(&config);
    check_demo_answers(&server);
    let (status, logs) = server.terminate();
    assert!(status.success(), "{logs}");
    assert_eq!(
        logs.matches("Downloaded model file").count(),
        0,
        "the restarted server downloaded again what its disk cache held: {logs}"
    );
}

/// One request on a fresh connection with plain std sockets: the status, or the I/O error
/// (refused, reset) that stopped it.
fn raw_get(addr: &str, path: &str, model: &str) -> std::io::Result<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr)?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nserve_multiplexed_model_id: {model}\r\nConnection: close\r\n\r\n"
    )?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {reply:?}")))
}

#[test]
fn sigterm_fails_readiness_first_and_loses_no_accepted_request() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tokio::time::Instant;
    let config = CONFIG
        .replace("load_ms: 50", "load_ms: 50\n          infer_ms: 200")
        .replace("  port: 0\n", "  port: 0\n  drain_grace_period_s: 1.0\n");
    let mut server = serve(&config);
    let addr = server.url.trim_start_matches("http://").to_string();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let (addr, stop) = (addr.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut results = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let result = raw_get(&addr, "/", &format!("m{}", i % 3));
                    let refused = result.is_err();
                    results.push((started, result.map_err(|e| e.to_string())));
                    if refused {
                        break;
                    }
                }
                results
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(600));
    let signalled = Instant::now();
    server.signal_term();
    // Readiness fails as soon as the signal is handled: well within the grace period (a
    // fixed 100 ms wait here was a bet on the signal's delivery on a busy machine).
    while raw_get(&addr, "/-/healthz", "").unwrap() != 503 {
        assert!(
            signalled.elapsed() < Duration::from_millis(500),
            "readiness did not fail at once"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        raw_get(&addr, "/health", "").unwrap(),
        503,
        "/health answers as /-/healthz does"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    let results: Vec<_> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    let during_grace = results
        .iter()
        .filter(|(t, r)| *t > signalled && *t < signalled + Duration::from_millis(800) && r.is_ok())
        .count();
    assert!(
        during_grace >= 6,
        "few requests served during the grace period: {results:?}"
    );
    for (started, result) in &results {
        match result {
            Ok(status) => assert_eq!(*status, 200, "an accepted request failed: {results:?}"),
            // Refused or reset connections: only once the grace period is over.
            Err(e) => assert!(
                *started > signalled + Duration::from_millis(900),
                "a request sent {:?} after SIGTERM was not served ({e})",
                started.saturating_duration_since(signalled)
            ),
        }
    }
    let exit = server.child.wait().unwrap();
    assert!(exit.success());
}

/// A stderr nobody reads (a stuck log shipper) must not stop the server: the log's writer
/// blocks on the full pipe, its bounded buffer fills, and from then on lines are dropped and
/// counted, never waited for. With the access line written on the request's task, requests
/// would stop once the pipe's 64 KiB (a few hundred lines) were full.
#[test]
fn a_log_nobody_reads_drops_lines_instead_of_stopping_requests() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    let config = format!("logging: {{max_buffered_bytes: 4096}}\n{CONFIG}");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", path.to_str().unwrap(), "--log-level", "info"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped()) // never read
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    // On a thread, so a server that stopped answering fails the test instead of hanging it.
    let (done, result) = std::sync::mpsc::channel();
    let target = url.clone();
    std::thread::spawn(move || {
        let bench = Command::new(BIN)
            .args(["bench", "--url", &target, "--models", "1"])
            .args(["--concurrency", "4", "--duration", "3", "--json"])
            .output()
            .unwrap();
        let metrics = send(&target, hyper::Request::get("/metrics"), Vec::new()).1;
        let _ = done.send((bench, metrics));
    });
    let answered = result.recv_timeout(std::time::Duration::from_secs(120));
    let _ = child.kill();
    let _ = child.wait();
    let (bench, metrics) =
        answered.expect("the server stopped answering while its log could not be written");
    let report: serde_json::Value = serde_json::from_slice(&bench.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&bench.stderr)));
    // Far more requests than the pipe holds lines, none failed.
    assert!(report["requests"].as_u64().unwrap() > 2000, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    let dropped = modelmux_promtext::parse(&metrics)
        .unwrap()
        .value("modelmux_log_lines_dropped_total", &[])
        .unwrap_or_else(|| panic!("no dropped-lines counter in {metrics}"));
    assert!(dropped > 0.0, "{metrics}");
}

/// `serve --help` says where the server listens by default; the benchmark helper is not among
/// the commands a newcomer reads.
#[test]
fn help_shows_the_default_address_and_only_the_users_commands() {
    let out = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(help.contains("http://127.0.0.1:8000"), "{help}");
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("serve") && help.contains("status") && help.contains("bench"));
    assert!(!help.contains("hello-server"), "{help}");
}
