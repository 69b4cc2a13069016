//! `modelmux deploy` against a running server under steady traffic: a deploy that changes
//! only another deployment's caps causes no failed request and no load in the untouched one
//! (and keeps the changed one's replica);
//! raising and lowering `num_replicas` loses no request; a changed model setting rolls the
//! deployment; an invalid configuration (or one reading a remote store without a disk cache)
//! is refused whole and the old one keeps serving; SIGHUP re-reads the file, and an invalid
//! file is refused, logged and the old configuration kept; a Python application whose
//! deployments changed is refused and keeps serving, one given new code takes it live; an LLM
//! deployment scales up and down live, every completion answered. The refusals that depend on
//! the two configurations only are unit tests in `src/config/reload.rs`.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
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
    modelmux_promtext::parse(&page)
        .unwrap()
        .sum_where("modelmux_model_loads_total", &[("deployment", deployment)])
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

/// The replicas of `deployment` in the server's `/-/models` listing.
fn replicas(url: &str, deployment: &str) -> Vec<serde_json::Value> {
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
        .cloned()
        .collect()
}

fn replica_ids(url: &str, deployment: &str) -> Vec<String> {
    replicas(url, deployment)
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Per replica of `deployment` (by id): the models it has loaded.
fn replica_models(url: &str, deployment: &str) -> BTreeMap<String, BTreeSet<String>> {
    replicas(url, deployment)
        .iter()
        .map(|r| {
            let loaded = r["loaded"].as_array().unwrap().iter();
            let ids = loaded.map(|m| m["id"].as_str().unwrap().to_owned());
            (r["id"].as_str().unwrap().to_owned(), ids.collect())
        })
        .collect()
}

/// Per replica of `deployment` (by id): the value of the counter `family` (one of the
/// `modelmux_model_*_total` series).
fn counter_by_replica(url: &str, deployment: &str, family: &str) -> BTreeMap<String, f64> {
    let request = hyper::Request::builder().uri("/metrics");
    let (_, page) = common::send(url, request, Vec::new());
    modelmux_promtext::parse(&page)
        .unwrap()
        .matching(family, &[("deployment", deployment)])
        .map(|s| (s.label("replica").unwrap().to_owned(), s.value))
        .collect()
}

/// The counters that would move if a deployment's models were loaded or unloaded again.
const MODEL_COUNTERS: [&str; 3] = [
    "modelmux_model_loads_total",
    "modelmux_model_unloads_total",
    "modelmux_model_evictions_total",
];

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
    // A's replicas, the models each holds, and each one's load, unload and eviction counts:
    // a deployment rolled would show new replica ids (its old ones' counters gone with them),
    // a model unloaded would leave its replica's listing and move its counters.
    let mut a_replicas = replica_ids(&url, "A");
    a_replicas.sort();
    assert_eq!(a_replicas.len(), 2, "{a_replicas:?}");
    let a_models = replica_models(&url, "A");
    let a_warm: usize = a_models.values().map(BTreeSet::len).sum();
    assert!(a_warm >= 3, "A is not warm: {a_models:?}");
    let a_counters = MODEL_COUNTERS.map(|family| counter_by_replica(&url, "A", family));
    assert_eq!(a_counters[0].len(), 2, "{a_counters:?}");

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
    let mut a_after = replica_ids(&url, "A");
    a_after.sort();
    assert_eq!(a_after, a_replicas, "A was restarted");
    let a_models_after = replica_models(&url, "A");
    for (replica, models) in &a_models {
        let now = &a_models_after[replica];
        assert!(
            models.is_subset(now),
            "A's replica {replica} unloaded {:?}",
            models.difference(now).collect::<Vec<_>>()
        );
    }
    for (family, before) in MODEL_COUNTERS.iter().zip(&a_counters) {
        assert_eq!(
            &counter_by_replica(&url, "A", family),
            before,
            "{family} of A's replicas moved"
        );
    }
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
    // A model now read from a remote store needs the disk cache, which this server (all
    // builtin models) did not open.
    let remote = config(1, 2).replacen("builtin://demo", "s3://models/demo", 1);
    let (ok, said) = deploy(&url, &remote);
    assert!(
        !ok && said.contains("deployment 'A' now reads from a remote store"),
        "{said}"
    );
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
    let applied = |logs: &str| logs.matches("SIGHUP: applied").count();
    assert_eq!(applied(&server.logs.lock()), 1);

    // An invalid file (which would also scale A to 3) is refused whole: the server logs why
    // and keeps serving the configuration it ran.
    let invalid = config(3, 3).replace("kind: onnx", "kind: nonsense");
    std::fs::write(&path, &invalid).unwrap();
    let hangup = || {
        assert!(
            Command::new("kill")
                .args(["-HUP", &pid])
                .status()
                .unwrap()
                .success()
        );
    };
    hangup();
    let refused = format!(
        "SIGHUP: {}: the new configuration is refused",
        path.display()
    );
    let mut tries = 0;
    while !server.logs.lock().contains(&refused) {
        tries += 1;
        assert!(tries < 200, "SIGHUP did not log its refusal within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = server.logs.lock().clone();
    let line = logs.lines().find(|l| l.contains(&refused)).unwrap();
    assert!(
        line.contains("nonsense"),
        "the refusal does not say why: {line}"
    );
    assert_eq!(replicas_of(&url, "A"), 2);
    assert_eq!(request(&url, "/a", "customer-1"), 200);
    assert_eq!(request(&url, "/b", "customer-1"), 200);

    // The running configuration is still the old one: the old file again changes nothing.
    std::fs::write(&path, config(2, 3)).unwrap();
    hangup();
    let mut tries = 0;
    while applied(&server.logs.lock()) < 2 {
        tries += 1;
        assert!(tries < 200, "the second SIGHUP was not applied within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = server.logs.lock().clone();
    let line = logs
        .lines()
        .rfind(|l| l.contains("SIGHUP: applied"))
        .unwrap();
    assert!(
        line.matches("kept").count() == 2 && !line.contains("rolled") && !line.contains("scaled"),
        "the refused file replaced the running configuration: {line}"
    );
    assert_eq!(replicas_of(&url, "A"), 2);
    let (_, logs) = server.terminate();
    assert!(!logs.contains("panicked"), "{logs}");
}

#[test]
fn a_python_application_whose_deployments_changed_is_refused_and_keeps_serving() {
    let config = |import_path: &str| {
        format!(
            "http_options:\n  port: 0\n  admin_token: deploy-token\napplications:\n  - name: default\n    route_prefix: /\n    import_path: {import_path}\n    runtime_env: {{working_dir: {}}}\n",
            common::python_apps_dir().display()
        )
    };
    let wrapper = [
        "env".to_owned(),
        format!("MODELMUX_PYTHON={}", common::test_python()),
        format!("PYTHONPATH={}", common::python_package_dir().display()),
    ];
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut server = common::serve_in(&wrapper, &config("composed:app"), &[]);
    let url = server.url.clone();
    let ask = || common::send(&url, hyper::Request::builder().uri("/"), Vec::new());
    assert_eq!(ask(), (200, "bar".to_owned()));

    // Another module's application: other deployments, which only a restart can set up.
    let (ok, said) = deploy(&url, &config("cross_app:adder"));
    assert!(
        !ok && said.contains(
            r#"application 'default': its deployments changed (["Downstream", "Upstream"] to ["Adder"])"#
        ),
        "{said}"
    );
    assert_eq!(ask(), (200, "bar".to_owned()));
    assert_eq!(replicas_of(&url, "Upstream"), 1);
    let (_, logs) = server.terminate();
    assert!(!logs.contains("panicked"), "{logs}");
}

/// An LLM deployment reloaded live: scaled from one replica to two and back while clients
/// keep asking, every completion answered, the ONNX deployment beside it untouched (its
/// replica and its models kept).
#[test]
fn an_llm_deployment_scales_live_and_answers_throughout() {
    let gguf = std::env::var("MODELMUX_TEST_GGUF")
        .unwrap_or_else(|_| panic!("MODELMUX_TEST_GGUF is not set: run ./scripts/test"));
    let config = |llm_replicas: usize| {
        format!(
            "
http_options:
  host: 127.0.0.1
  port: 0
  admin_token: deploy-token
applications:
  - name: llm
    deployments:
      - name: LLMServer
        num_replicas: {llm_replicas}
        model:
          kind: llm
          model_loading_config: {{model_id: smollm2, model_source: '{gguf}'}}
          engine_kwargs: {{max_num_seqs: 4, max_model_len: 256, kv_cache_bytes: 67108864}}
  - name: a
    route_prefix: /a
    deployments:
      - name: A
        max_models_per_replica: 3
        model:
          kind: onnx
          repository: builtin://demo
"
        )
    };
    let mut server = common::serve(&config(1));
    let url = server.url.clone();
    assert_eq!(request(&url, "/a", "customer-1"), 200);
    let (a_ids, a_models) = (replica_ids(&url, "A"), replica_models(&url, "A"));

    let stop = Arc::new(AtomicBool::new(false));
    let (answered, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let client = {
        let (url, stop) = (url.clone(), stop.clone());
        let (answered, failed) = (answered.clone(), failed.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                let request = hyper::Request::post("/v1/completions")
                    .header("content-type", "application/json");
                let body = br#"{"model": "smollm2", "prompt": "Hello", "max_tokens": 2}"#;
                let (status, answer) = common::send(&url, request, body.to_vec());
                if status == 200 {
                    answered.fetch_add(1, Ordering::SeqCst);
                } else {
                    eprintln!("completion failed during the reload: {status} {answer}");
                    failed.fetch_add(1, Ordering::SeqCst);
                }
            }
        })
    };
    for (replicas, step) in [(2, "up"), (1, "down")] {
        let before = answered.load(Ordering::SeqCst);
        let (ok, said) = deploy(&url, &config(replicas));
        assert!(ok, "scaling {step}: {said}");
        assert_eq!(replicas_of(&url, "LLMServer"), replicas, "scaling {step}");
        // Answers keep coming after the deploy (not only before it).
        for tries in 0.. {
            if answered.load(Ordering::SeqCst) >= before + 3 {
                break;
            }
            assert!(
                tries < 600,
                "no completion answered within 60 s of scaling {step}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    stop.store(true, Ordering::SeqCst);
    client.join().unwrap();
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "completions failed during the reloads"
    );
    assert_eq!(
        replica_ids(&url, "A"),
        a_ids,
        "the ONNX deployment's replica changed"
    );
    assert_eq!(
        replica_models(&url, "A"),
        a_models,
        "the ONNX deployment lost models"
    );
    let (_, logs) = server.terminate();
    assert!(!logs.contains("panicked"), "{logs}");
}

/// A Python application reloaded live: new code (another working directory) and a deployment
/// setting its entry overrides (two replicas), applied while a client keeps asking; every
/// request is answered, and once the deploy has answered, only by the new code.
#[test]
fn a_python_application_takes_new_code_live_and_answers_throughout() {
    let version = |v: &str| {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("versioned.py"),
            format!(
                "from modelmux import serve\n\n\n@serve.deployment\nclass Versioned:\n    def __call__(self):\n        return \"{v}\"\n\n\napp = Versioned.bind()\n"
            ),
        )
        .unwrap();
        dir
    };
    let (one, two) = (version("v1"), version("v2"));
    let config = |dir: &tempfile::TempDir, replicas: usize| {
        format!(
            "http_options:\n  port: 0\n  admin_token: deploy-token\napplications:\n  - name: default\n    route_prefix: /\n    import_path: versioned:app\n    runtime_env: {{working_dir: {}}}\n    deployments:\n      - name: Versioned\n        num_replicas: {replicas}\n",
            dir.path().display()
        )
    };
    let wrapper = [
        "env".to_owned(),
        format!("MODELMUX_PYTHON={}", common::test_python()),
        format!("PYTHONPATH={}", common::python_package_dir().display()),
    ];
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut server = common::serve_in(&wrapper, &config(&one, 1), &[]);
    let url = server.url.clone();
    let ask = |url: &str| common::send(url, hyper::Request::builder().uri("/"), Vec::new());
    assert_eq!(ask(&url), (200, "v1".to_owned()));

    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let client = {
        let (url, stop, answers) = (url.clone(), stop.clone(), answers.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                answers.lock().push(ask(&url));
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let (ok, said) = deploy(&url, &config(&two, 2));
    assert!(ok, "{said}");
    // The deploy answers once the old replicas are gone: from then on, only the new code.
    let after = answers.lock().len();
    for tries in 0.. {
        if answers.lock().len() >= after + 20 {
            break;
        }
        assert!(tries < 500, "no answers after the deploy");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::SeqCst);
    client.join().unwrap();
    let answers = answers.lock();
    let failed: Vec<&(u16, String)> = answers.iter().filter(|(s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "requests failed during the reload: {failed:?}"
    );
    let bodies: Vec<&str> = answers.iter().map(|(_, b)| b.as_str()).collect();
    // During the roll both may answer (new replicas take traffic before the old drain);
    // once the deploy has answered, only the new code does.
    assert!(
        bodies.iter().all(|b| *b == "v1" || *b == "v2"),
        "{bodies:?}"
    );
    // (The one answer that may have been in flight as the deploy answered aside.)
    assert!(
        bodies[after + 1..].iter().all(|b| *b == "v2"),
        "the old code answered after the deploy: {:?}",
        &bodies[after..]
    );
    assert_eq!(replicas_of(&url, "Versioned"), 2);
    let (_, logs) = server.terminate();
    assert!(!logs.contains("panicked"), "{logs}");
}
