//! `modelmux deploy` against a running server under steady traffic: a deploy that changes
//! only another deployment's caps causes no failed request and no load in the untouched one
//! (and keeps the changed one's replica);
//! raising and lowering `num_replicas` loses no request; a changed model setting rolls the
//! deployment; an invalid configuration is refused whole and the old one keeps serving;
//! SIGHUP re-reads the file.

use crate::common;

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

fn config(a_replicas: usize, b_models: usize) -> String {
    format!(
        "
http_options:
  host: 127.0.0.1
  port: 0
  admin_token: deploy-token
applications:
  - name: a
    route_prefix: /a
    deployments:
      - name: A
        num_replicas: {a_replicas}
        max_models_per_replica: 3
        model:
          kind: onnx
          repository: builtin://demo
  - name: b
    route_prefix: /b
    deployments:
      - name: B
        num_replicas: 1
        max_models_per_replica: {b_models}
        model:
          kind: onnx
          repository: builtin://demo
"
    )
}

const BODY: &str = r#"{"inputs": [[0.5, -1.2, 3.3, 0.1]]}"#;

fn request(url: &str, prefix: &str, model: &str) -> u16 {
    let request = hyper::Request::builder()
        .method("POST")
        .uri(prefix)
        .header("serve_multiplexed_model_id", model);
    common::send(url, request, BODY.as_bytes().to_vec()).0
}

/// The sum of `modelmux_model_loads_total` over the replicas of `deployment`.
fn loads(url: &str, deployment: &str) -> f64 {
    let request = hyper::Request::builder().uri("/metrics");
    let (_, page) = common::send(url, request, Vec::new());
    page.lines()
        .filter(|l| {
            l.starts_with("modelmux_model_loads_total{")
                && l.contains(&format!("deployment=\"{deployment}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `modelmux deploy` of `text` (written to a file); its exit status and output.
fn deploy(url: &str, text: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("next.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(common::BIN)
        .args(["deploy", path.to_str().unwrap(), "--url", url])
        .args(["--token", "deploy-token"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn replica_ids(url: &str, deployment: &str) -> Vec<String> {
    let request = hyper::Request::builder()
        .uri("/-/models")
        .header("authorization", "Bearer deploy-token");
    let (_, body) = common::send(url, request, Vec::new());
    let models: serde_json::Value = serde_json::from_str(&body).unwrap();
    models["applications"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|a| a["deployments"].as_array().unwrap().iter())
        .filter(|d| d["name"] == deployment)
        .flat_map(|d| d["replicas"].as_array().unwrap().iter())
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

fn replicas_of(url: &str, deployment: &str) -> usize {
    replica_ids(url, deployment).len()
}

/// Steady traffic to both applications on three threads until stopped; counts failures.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    failed: Arc<parking_lot::Mutex<Vec<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(url: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let threads = (0..3)
            .map(|t| {
                let (url, stop, sent, failed) =
                    (url.to_owned(), stop.clone(), sent.clone(), failed.clone());
                std::thread::spawn(move || {
                    let mut i = t;
                    while !stop.load(Ordering::SeqCst) {
                        let prefix = if i % 2 == 0 { "/a" } else { "/b" };
                        let model = format!("customer-{}", 1 + i % 3);
                        let status = request(&url, prefix, &model);
                        sent.fetch_add(1, Ordering::SeqCst);
                        if status != 200 {
                            failed.lock().push(format!("{prefix} {model}: {status}"));
                        }
                        i += 1;
                    }
                })
            })
            .collect();
        Self {
            stop,
            sent,
            failed,
            threads,
        }
    }

    fn stop(self) -> (usize, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            t.join().unwrap();
        }
        (self.sent.load(Ordering::SeqCst), self.failed.lock().clone())
    }
}

#[test]
fn deploys_change_only_what_changed_and_lose_no_request() {
    let mut server = common::serve(&config(2, 3));
    let url = server.url.clone();
    // Warm both: every model on some replica of each.
    for prefix in ["/a", "/b"] {
        for m in 1..=3 {
            assert_eq!(request(&url, prefix, &format!("customer-{m}")), 200);
        }
    }
    let traffic = Traffic::start(&url);
    std::thread::sleep(Duration::from_millis(300));
    let a_loads = loads(&url, "A");

    // Only B changes (its cap, in place): A keeps its replicas and warm models; B keeps its
    // replica.
    let b_replica = replica_ids(&url, "B");
    let (ok, said) = deploy(&url, &config(2, 2));
    assert!(ok, "{said}");
    assert!(
        said.contains("a/A: kept") && said.contains("b/B: caps changed in place (max_models 2"),
        "{said}"
    );
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        loads(&url, "A"),
        a_loads,
        "the untouched deployment loaded models"
    );
    assert_eq!(replica_ids(&url, "B"), b_replica, "B was restarted");

    // Another setting of B changes: B rolls to a new replica, and back.
    let other = config(2, 2).replace(
        "        max_models_per_replica: 2",
        "        max_ongoing_requests: 7\n        max_models_per_replica: 2",
    );
    let (ok, said) = deploy(&url, &other);
    assert!(ok && said.contains("b/B: rolled"), "{said}");
    assert_ne!(replica_ids(&url, "B"), b_replica, "B was not rolled");
    let (ok, said) = deploy(&url, &config(2, 2));
    assert!(ok && said.contains("b/B: rolled"), "{said}");

    // A scales up, then down: no request is lost.
    let (ok, said) = deploy(&url, &config(3, 2));
    assert!(ok && said.contains("a/A: scaled to 3"), "{said}");
    assert_eq!(replicas_of(&url, "A"), 3);
    std::thread::sleep(Duration::from_millis(300));
    let (ok, said) = deploy(&url, &config(1, 2));
    assert!(ok && said.contains("a/A: scaled to 1"), "{said}");
    assert_eq!(replicas_of(&url, "A"), 1);
    std::thread::sleep(Duration::from_millis(300));

    // An invalid configuration is refused whole; the old one keeps serving.
    let invalid = config(2, 2).replace("kind: onnx", "kind: nonsense");
    let (ok, said) = deploy(&url, &invalid);
    assert!(!ok && said.contains("refused"), "{said}");
    let restart = config(1, 2).replace("port: 0", "port: 1");
    let (ok, said) = deploy(&url, &restart);
    assert!(!ok && said.contains("http_options"), "{said}");
    assert_eq!(replicas_of(&url, "A"), 1);

    // The same configuration again: nothing changes.
    let (ok, said) = deploy(&url, &config(1, 2));
    assert!(
        ok && said.contains("a/A: kept") && said.contains("b/B: kept"),
        "{said}"
    );

    let (sent, failed) = traffic.stop();
    assert!(sent > 50, "only {sent} requests were sent");
    assert!(
        failed.is_empty(),
        "{} of {sent} failed: {failed:?}",
        failed.len()
    );
    let (_, logs) = server.terminate();
    assert!(!logs.contains("panicked"), "{logs}");
}

#[test]
fn sighup_rereads_the_file_the_server_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config(1, 3)).unwrap();
    let mut server = common::start(&["serve", path.to_str().unwrap()]);
    let url = server.url.clone();
    assert_eq!(replicas_of(&url, "A"), 1);
    std::fs::write(&path, config(2, 3)).unwrap();
    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .unwrap()
            .success()
    );
    let mut tries = 0;
    while replicas_of(&url, "A") != 2 {
        tries += 1;
        assert!(tries < 200, "SIGHUP did not scale A to 2 within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(request(&url, "/a", "customer-1"), 200);
    let (_, logs) = server.terminate();
    assert!(logs.contains("SIGHUP: applied"), "{logs}");
}
