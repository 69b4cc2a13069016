//! The `modelmux` binary as a user runs it: a YAML file, the guide's request, the log lines,
//! `status`, `bench`, a bad configuration, and SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_modelmux");

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

struct Running {
    child: Child,
    url: String,
    /// Everything the server logged so far, drained continuously by a thread: a pipe nobody
    /// reads fills up and blocks the server's logging.
    logs: std::sync::Arc<parking_lot::Mutex<String>>,
    drain: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Sends SIGTERM, waits (bounded) for the process to exit, and returns its exit status and
    /// everything it logged.
    fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let mut waited = Duration::ZERO;
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(waited < Duration::from_secs(20), "did not stop");
            std::thread::sleep(Duration::from_millis(50));
            waited += Duration::from_millis(50);
        };
        if let Some(drain) = self.drain.take() {
            drain.join().unwrap();
        }
        let logs = self.logs.lock().clone();
        (exit, logs)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `modelmux serve` on a free port and waits for its "serving ... on" line.
fn serve(config: &str) -> Running {
    serve_with(config, &[])
}

fn serve_with(config: &str, extra: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", path.to_str().unwrap(), "--log-level", "info"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .trim_end_matches('/')
        .to_string();
    std::mem::forget(dir); // the server read its config already; keep the file for its lifetime
    let logs = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let sink = logs.clone();
    let drain = std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
            sink.lock().push_str(&line);
            line.clear();
        }
    });
    Running {
        child,
        url,
        logs,
        drain: Some(drain),
    }
}

/// `curl -H 'serve_multiplexed_model_id: <model>' <url>/`.
fn curl(url: &str, model: &str) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::get("/")
            .header("host", "x")
            .header("serve_multiplexed_model_id", model)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        use http_body_util::BodyExt;
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    })
}

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

    let status = Command::new(BIN)
        .args(["status", "--url", &server.url])
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
    assert!(report["requests"].as_u64().unwrap() > 50, "{report}");
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
}
