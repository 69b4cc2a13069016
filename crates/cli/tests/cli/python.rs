//! Python deployments end to end: the real `modelmux` binary, real worker processes running the
//! checkout's `python/modelmux` package on the interpreter MODELMUX_TEST_PYTHON names (which
//! `scripts/test` provides, with numpy and starlette; the tests fail without it), and the Ray
//! Serve examples of `python_apps/` with only the import changed.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use common::Running;
use common::{
    python_apps_dir as apps_dir, python_package_dir as package_dir, test_python as python,
};

/// `modelmux serve` on `config`, its workers on the test Python with the checkout's package;
/// `env` adds variables (`NAME=value`).
fn serve(config: &str, env: &[String]) -> Running {
    serve_args(config, env, &[])
}

/// [`serve`] with more arguments for `modelmux serve`.
fn serve_args(config: &str, env: &[String], args: &[&str]) -> Running {
    let mut wrapper = vec![
        "env".to_string(),
        format!("MODELMUX_PYTHON={}", python()),
        format!("PYTHONPATH={}", package_dir().display()),
    ];
    wrapper.extend(env.iter().cloned());
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    common::serve_in(&wrapper, config, args)
}

fn app_config(import_path: &str, deployments: &str) -> String {
    format!(
        "http_options: {{port: 0}}\napplications:\n  - name: default\n    route_prefix: /\n    import_path: {import_path}\n    runtime_env: {{working_dir: {}}}\n{deployments}",
        apps_dir().display()
    )
}

/// `GET <url><path>` (a POST with `body` when not empty), for `model` when not empty.
fn request(url: &str, path: &str, model: &str, body: &str) -> (u16, String) {
    let mut builder = http::Request::builder()
        .method(if body.is_empty() { "GET" } else { "POST" })
        .uri(path);
    if !model.is_empty() {
        builder = builder.header("serve_multiplexed_model_id", model);
    }
    if path.starts_with("/-/") {
        builder = common::as_local_admin(url, builder);
    }
    common::send(url, builder, body.as_bytes().to_vec())
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The seed's weights for model `id`, computed here from their definition.
fn expected(id: f64, x: [f64; 4]) -> Vec<f64> {
    (0..3)
        .map(|j| {
            (0..4)
                .map(|i| x[i] * (7.0 * id + 3.0 * i as f64 + j as f64).sin())
                .sum()
        })
        .collect()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Loaded models per replica of the application's deployment, from `/-/models`.
fn held(url: &str) -> HashMap<String, Vec<String>> {
    let (status, body) = request(url, "/-/models", "", "");
    assert_eq!(status, 200, "{body}");
    let mut out = HashMap::new();
    let models = json(&body);
    for app in models["applications"].as_array().unwrap() {
        for deployment in app["deployments"].as_array().unwrap() {
            for replica in deployment["replicas"].as_array().unwrap() {
                let ids = replica["loaded"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["id"].as_str().unwrap().to_string())
                    .collect();
                out.insert(replica["id"].as_str().unwrap().to_string(), ids);
            }
        }
    }
    out
}

#[test]
fn the_seed_inferencer_answers_like_numpy_and_requests_go_to_the_replica_holding_the_model() {
    let server = serve(
        &app_config(
            "inferencer:entry",
            "    deployments:\n      - name: ModelInferencer\n        num_replicas: 2\n",
        ),
        &[],
    );
    let x = [0.5, -1.0, 2.0, 0.25];
    let body = format!("{{\"x\": {x:?}}}");
    let (status, answer) = request(&server.url, "/", "1", &body);
    assert_eq!(status, 200, "{answer}");
    let answer = json(&answer);
    let y: Vec<f64> = serde_json::from_value(answer["y"].clone()).unwrap();
    for (got, want) in y.iter().zip(expected(1.0, x)) {
        assert!(
            (got - want).abs() < 1e-12,
            "{y:?} vs {:?}",
            expected(1.0, x)
        );
    }
    let first_pid = answer["pid"].clone();
    for _ in 0..10 {
        let (status, again) = request(&server.url, "/", "1", &body);
        assert_eq!(status, 200);
        assert_eq!(
            json(&again)["pid"],
            first_pid,
            "model 1 must stay on its replica"
        );
    }
    // Ray's multiplexing names: the deployment, its replicas, and the model they hold.
    let holders: Vec<_> = held(&server.url)
        .into_iter()
        .filter(|(_, ids)| ids.contains(&"1".to_string()))
        .collect();
    assert_eq!(holders.len(), 1, "one copy of model 1: {holders:?}");
}

#[test]
fn caps_hold_under_load_del_runs_once_per_eviction_and_a_burst_loads_once() {
    let dir = tempfile::tempdir().unwrap();
    let loads = dir.path().join("loads");
    let dels = dir.path().join("dels");
    let server = serve(
        &app_config(
            "inferencer:entry",
            "    deployments:\n      - name: ModelInferencer\n        num_replicas: 2\n        max_ongoing_requests: 16\n",
        ),
        &[
            format!("MODELMUX_TEST_LOAD_LOG={}", loads.display()),
            format!("MODELMUX_TEST_DEL_LOG={}", dels.display()),
        ],
    );
    // A burst of 50 first requests for one model: one load.
    let url = server.url.clone();
    let burst: Vec<_> = (0..50)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || request(&url, "/", "42", ""))
        })
        .collect();
    for handle in burst {
        let (status, body) = handle.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(
        lines(&loads).iter().filter(|l| *l == "42").count(),
        1,
        "loads: {:?}",
        lines(&loads)
    );

    // 8 models over 2 replicas of 3: never more than 3 on a replica.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (url, stop) = (url.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let id = ((n * 5 + c * 3) % 8).to_string();
                    let (status, body) = request(&url, "/", &id, "");
                    assert_eq!(status, 200, "{body}");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let mut most = 0;
    for _ in 0..40 {
        for (replica, ids) in held(&url) {
            assert!(ids.len() <= 3, "{replica} holds {ids:?}");
            most = most.max(ids.len());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let served: usize = clients.into_iter().map(|c| c.join().unwrap()).sum();
    assert!(served > 20, "only {served} requests served");
    assert_eq!(
        most, 3,
        "the caps were never reached: the test did not test them"
    );
    // Every load is either still held or was dropped exactly once. A worker writes its `del`
    // line when the model object goes, a moment after the eviction: read until it balances.
    let unbalanced = || {
        let still: Vec<String> = held(&url).into_values().flatten().collect();
        let mut loaded: HashMap<String, usize> = HashMap::new();
        for id in lines(&loads) {
            *loaded.entry(id).or_default() += 1;
        }
        let mut deleted: HashMap<String, usize> = HashMap::new();
        for id in lines(&dels) {
            *deleted.entry(id).or_default() += 1;
        }
        if deleted.values().sum::<usize>() == 0 {
            return Some("nothing was evicted".to_owned());
        }
        loaded.iter().find_map(|(id, n)| {
            let held_now = still.iter().filter(|s| *s == id).count();
            (deleted.get(id).copied().unwrap_or(0) + held_now != *n).then(|| {
                format!(
                    "model {id}: {n} loads, {held_now} held, dels {:?}",
                    deleted.get(id)
                )
            })
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while let Some(why) = unbalanced() {
        assert!(tokio::time::Instant::now() < deadline, "{why}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn loader_and_call_exceptions_answer_500_naming_them_and_the_replica_carries_on() {
    let server = serve(&app_config("inferencer:entry", ""), &[]);
    let (status, body) = request(&server.url, "/", "broken", "");
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("ValueError") && body.contains("no weights for model broken"),
        "{body}"
    );
    let (status, body) = request(&server.url, "/boom", "2", "");
    assert_eq!(status, 500, "{body}");
    assert!(
        body.contains("KeyError") && body.contains("boom was asked for"),
        "{body}"
    );
    let (status, body) = request(&server.url, "/", "2", "");
    assert_eq!(status, 200, "{body}");
}

/// The inferencer on two replicas, with `more` settings for its deployment.
fn two_replicas(more: &str) -> Running {
    let deployments =
        format!("    deployments:\n      - name: ModelInferencer\n        num_replicas: 2\n{more}");
    serve(&app_config("inferencer:entry", &deployments), &[])
}

/// Requests in progress on the server's replicas (its `/metrics`).
fn ongoing(url: &str) -> f64 {
    let (status, page) = common::send(url, http::Request::get("/metrics"), Vec::new());
    assert_eq!(status, 200, "{page}");
    modelmux_promtext::parse(&page)
        .unwrap()
        .sum("modelmux_replica_ongoing_requests")
}

/// Waits (bounded) until more than `before` requests are in progress, instead of guessing how
/// long one takes to get there.
fn until_in_flight(url: &str, before: f64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ongoing(url) <= before {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no new request in flight within 10 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Loads model 5, sends `path` for it, and kills the worker serving it (SIGKILL) once the
/// request is in flight; returns the killed worker's pid and the request's thread.
fn kill_mid_request(
    server: &Running,
    path: &'static str,
) -> (i64, std::thread::JoinHandle<(u16, String)>) {
    let (status, body) = request(&server.url, "/", "5", "");
    assert_eq!(status, 200, "{body}");
    let pid = json(&body)["pid"].as_i64().unwrap();
    let url = server.url.clone();
    let before = ongoing(&url);
    let in_flight = std::thread::spawn(move || request(&url, path, "5", ""));
    until_in_flight(&server.url, before);
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    (pid, in_flight)
}

#[test]
fn a_killed_worker_fails_its_requests_with_503_and_comes_back() {
    let server = two_replicas("");
    let (pid, slow) = kill_mid_request(&server, "/slow");
    let (status, body) = slow.join().unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("exited") || body.contains("closed"), "{body}");
    // The model left the router's view with its worker, at once: by the time its request has
    // failed, no replica is listed as holding it (a router that still saw it there would send
    // its next requests to wait for the restarted worker).
    let holding: Vec<String> = held(&server.url)
        .into_iter()
        .filter(|(_, models)| models.iter().any(|m| m == "5"))
        .map(|(replica, _)| replica)
        .collect();
    assert!(
        holding.is_empty(),
        "model 5 still listed on {holding:?} after its worker died"
    );
    // The next request loads it on a live worker.
    let (status, body) = request(&server.url, "/", "5", "");
    assert_eq!(
        status, 200,
        "the request right after the worker died: {body}"
    );
    let back = json(&body)["pid"].as_i64().unwrap();
    assert_ne!(back, pid, "served by the killed worker");
    // Both replicas serve again (the restarted one included): 20 models spread over them.
    let pids: HashSet<i64> = (0..20)
        .map(|i| {
            let (status, body) = request(&server.url, "/", &format!("{}", 100 + i), "");
            assert_eq!(status, 200, "{body}");
            json(&body)["pid"].as_i64().unwrap()
        })
        .collect();
    assert_eq!(pids.len(), 2, "{pids:?}");
}

#[test]
fn an_application_that_fails_to_import_stops_the_server_with_file_line_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, app_config("bad_import:app", "")).unwrap();
    let output = std::process::Command::new(common::BIN)
        .args(["serve", config.to_str().unwrap()])
        .env("MODELMUX_PYTHON", python())
        .env("PYTHONPATH", package_dir())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad_import.py:9")
            && stderr.contains("KeyError")
            && stderr.contains("missing"),
        "{stderr}"
    );
}

#[test]
fn a_deployment_calls_another_through_a_handle_with_a_model_id_that_nested_calls_do_not_inherit() {
    let server = serve(&app_config("composed:app", ""), &[]);
    let (status, body) = request(&server.url, "/", "", "");
    assert_eq!((status, body.as_str()), (200, "bar"));
    let (status, body) = request(&server.url, "/plain", "mine", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"mine": "mine", "callee": ""})
    );
}

#[test]
fn batches_form_under_concurrent_traffic_and_never_mix_model_ids() {
    let server = serve(&app_config("batched:app", ""), &[]);
    let url = server.url.clone();
    let clients: Vec<_> = (0..48)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let id = ["a", "b", "c"][i % 3];
                (id, request(&url, "/", id, ""))
            })
        })
        .collect();
    let mut largest = 0;
    for client in clients {
        let (id, (status, body)) = client.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let answer = json(&body);
        assert_eq!(answer["model"], id);
        let batch = answer["batch"].as_array().unwrap();
        assert!(batch.iter().all(|b| b == id), "{id} batched with {batch:?}");
        largest = largest.max(batch.len());
    }
    assert!(largest > 1, "no batch held more than one request");
}

/// The admin API's reconfigure control of the Streamer deployment, with `user_config`.
fn reconfigure_streamer(url: &str, user_config: &str) {
    let reconfigure = http::Request::post("/-/deployments/Streamer/controls/reconfigure")
        .header("content-type", "application/json");
    let reconfigure = common::as_local_admin(url, reconfigure);
    let (status, body) = common::send(url, reconfigure, user_config.as_bytes().to_vec());
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_streaming_response_streams_and_user_config_reaches_reconfigure() {
    let server = serve(&app_config("streaming:app", ""), &[]);
    let (status, body) = request(&server.url, "/greeting", "", "");
    assert_eq!((status, body.as_str()), (200, "hello"));
    // The first line reaches the client before the rest are made: the generator makes them
    // only once `/release` is asked for, which the client does when the first has arrived (a
    // response held until its body ends would never get there).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (first, text) = rt.block_on(common::stream_through_gate(&server.url, "/", "/release"));
    assert_eq!((first.as_str(), text.as_str()), ("0\n", "0\n1\n2\n3\n4\n"));
    // The admin API's reconfigure control passes a new user_config to every replica.
    reconfigure_streamer(&server.url, r#"{"greeting": "bonjour"}"#);
    let (status, body) = request(&server.url, "/greeting", "", "");
    assert_eq!((status, body.as_str()), (200, "bonjour"));
}

/// The reconfigure control reaches every replica: with two replicas of one slot each, two
/// requests at once are served by both, and both answer with the new `user_config`.
#[test]
fn reconfigure_reaches_every_replica() {
    let replicas = "    deployments:\n      - name: Streamer\n        num_replicas: 2\n        max_ongoing_requests: 1\n";
    let server = serve(&app_config("streaming:app", replicas), &[]);
    reconfigure_streamer(&server.url, r#"{"greeting": "bonjour"}"#);
    for round in 0..3 {
        let both: Vec<_> = (0..2)
            .map(|_| {
                let url = server.url.clone();
                std::thread::spawn(move || request(&url, "/slow-greeting", "", ""))
            })
            .collect();
        for answer in both {
            assert_eq!(
                answer.join().unwrap(),
                (200, "bonjour".to_owned()),
                "round {round}: a replica kept the old user_config"
            );
        }
    }
}

#[test]
fn a_client_that_stops_reading_a_stream_stalls_only_its_own_stream() {
    let server = serve(&app_config("streaming:app", ""), &[]);
    // Asks for 256 MiB and reads none of it: the socket's buffers, then its stream's window,
    // fill, and the worker waits for credit on that stream only.
    let address = server.url.trim_start_matches("http://").to_string();
    let mut stalled = std::net::TcpStream::connect(&address).unwrap();
    std::io::Write::write_all(&mut stalled, b"GET /flood HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    std::thread::sleep(Duration::from_secs(2));
    // The same worker answers other requests meanwhile, at once.
    for _ in 0..3 {
        let started = tokio::time::Instant::now();
        let (status, body) = request(&server.url, "/greeting", "", "");
        assert_eq!((status, body.as_str()), (200, "hello"));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "a request waited {:?} behind a stream nobody reads",
            started.elapsed()
        );
    }
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_model_loaded_on_one_node_is_served_there_when_asked_through_another() {
    let etcd = modelmux_cluster::LocalEtcd::start(1).await.unwrap();
    let cluster = etcd.cluster_url();
    let config = app_config("inferencer:entry", "").replace(
        "applications:",
        "cluster: {name: python, lease_ttl_s: 2}\napplications:",
    );
    let node = |id: &'static str| {
        let (config, cluster) = (config.clone(), cluster.clone());
        tokio::task::spawn_blocking(move || {
            serve_args(
                &config,
                &[],
                &["--cluster", &cluster, "--node-id", id, "--role", "both"],
            )
        })
    };
    let (a, b) = (node("a").await.unwrap(), node("b").await.unwrap());
    let ask = |url: String, model: &'static str| {
        tokio::task::spawn_blocking(move || request(&url, "/", model, ""))
    };
    let (status, body) = ask(a.url.clone(), "7").await.unwrap();
    assert_eq!(status, 200, "{body}");
    let pid_a = json(&body)["pid"].clone();
    // Node b hears that a's replica holds model 7, then sends it there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let url = b.url.clone();
        let held = tokio::task::spawn_blocking(move || held(&url))
            .await
            .unwrap();
        if held.values().any(|ids| ids.contains(&"7".to_string())) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "node b never saw model 7: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        let (status, body) = ask(b.url.clone(), "7").await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert_eq!(json(&body)["pid"], pid_a, "served by node b's own worker");
    }
    drop((a, b));
}

#[test]
fn a_script_that_runs_two_applications_in_turn_gets_their_answers_and_leaves_no_process() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Every process the script starts inherits this; none may have it once the script is done.
    let marker = format!("MODELMUX_TEST_MARKER=driver-{}-{port}", std::process::id());
    let output = std::process::Command::new(python())
        .arg(apps_dir().join("driver.py"))
        .env("MODELMUX_BIN", common::BIN)
        .env("MODELMUX_TEST_PORT", port.to_string())
        .env("PYTHONPATH", package_dir())
        .env(
            marker.split_once('=').unwrap().0,
            marker.split_once('=').unwrap().1,
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let seen = json(stdout.lines().last().unwrap_or_default());
    assert_eq!(
        seen,
        serde_json::json!({"composed": "bar", "status": "RUNNING", "http": "adder", "handle": 42}),
        "{stderr}"
    );
    let left = common::processes_with(&marker);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Sends `GET <path>` and never reads the answer (the connection closes with the test).
fn send_and_forget(url: &str, path: &str) {
    use std::io::Write;
    let mut stream = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    write!(stream, "GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").unwrap();
    std::mem::forget(stream);
}

#[test]
fn the_python_demo_serves_each_customer_from_its_own_weights_through_the_preprocessing_handle() {
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python/config.yaml");
    let wrapper = [
        "env".to_string(),
        format!("MODELMUX_PYTHON={}", python()),
        format!("PYTHONPATH={}", package_dir().display()),
    ];
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let server = common::start_in(
        &wrapper,
        &["serve", config.to_str().unwrap(), "--port", "0"],
    );
    let body = r#"{"features": [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3]]}"#;
    let mut answers = Vec::new();
    for customer in ["customer-1", "customer-2"] {
        let (status, answer) = request(&server.url, "/", customer, body);
        assert_eq!(status, 200, "{answer}");
        let answer = json(&answer);
        assert_eq!(answer["customer"], customer);
        let rows: Vec<Vec<f64>> = serde_json::from_value(answer["probabilities"].clone()).unwrap();
        assert_eq!(rows.len(), 2);
        for row in &rows {
            assert_eq!(row.len(), 3);
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-9, "{row:?}");
        }
        answers.push(rows);
    }
    assert_ne!(answers[0], answers[1], "two customers, one set of weights");
    let (status, answer) = request(&server.url, "/", "customer-99", body);
    assert_eq!(status, 500, "{answer}");
    assert!(answer.contains("FileNotFoundError"), "{answer}");
    let (status, answer) = request(&server.url, "/", "", body);
    assert_eq!(status, 400, "{answer}");
}

#[test]
fn a_fastapi_ingress_serves_class_routes_beside_a_built_in_application() {
    // Python and built-in deployments in one configuration, one application each.
    let config = app_config("fastapi_ingress:app", "")
        .replace("route_prefix: /\n", "route_prefix: /api\n")
        + "  - name: synthetic\n    route_prefix: /\n    deployments:\n      - name: Synthetic\n        model: {kind: synthetic, load_ms: 1}\n";
    let server = serve(&config, &[]);
    let (status, body) = request(&server.url, "/api/hello/Ada?punctuation=.", "m1", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"text": "Bonjour, Ada.", "model": "m1"})
    );
    let (status, body) = request(&server.url, "/api/nowhere", "", "");
    assert_eq!(status, 404, "{body}");
    let (status, body) = request(&server.url, "/", "s1", "");
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_worker_that_stops_answering_health_checks_is_replaced_and_none_outlives_a_killed_server() {
    let marker = format!("MODELMUX_TEST_MARKER=hang-{}", std::process::id());
    let server = serve(&app_config("hang:app", ""), std::slice::from_ref(&marker));
    let (status, body) = request(&server.url, "/", "", "");
    assert_eq!(status, 200, "{body}");
    let hung = json(&body)["pid"].clone();
    let url = server.url.clone();
    // Never answered by the hung worker; ends when its replica is drained and stopped.
    std::thread::spawn(move || request(&url, "/hang", "", ""));
    let started = tokio::time::Instant::now();
    loop {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the hung replica was never replaced"
        );
        std::thread::sleep(Duration::from_millis(200));
        let url = server.url.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(request(&url, "/", "", "")));
        if let Ok((200, body)) = rx.recv_timeout(Duration::from_secs(5))
            && json(&body)["pid"] != hung
        {
            break;
        }
    }
    // Hang the new worker too, then kill the server outright: no worker may stay behind, not
    // even one stuck in user code that never reads its socket's end.
    let before = ongoing(&server.url);
    send_and_forget(&server.url, "/hang");
    until_in_flight(&server.url, before);
    drop(server);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let left = common::processes_with(&marker);
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left behind: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_idempotent_deployments_request_whose_worker_dies_runs_again_elsewhere() {
    let server = two_replicas("        idempotent: true\n");
    let (pid, waiting) = kill_mid_request(&server, "/wait");
    let (status, body) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert_ne!(json(&body)["pid"].as_i64().unwrap(), pid);
}

#[test]
fn sigterm_lets_python_requests_in_flight_finish_then_stops_the_workers() {
    let marker = format!("MODELMUX_TEST_MARKER=drain-{}", std::process::id());
    let mut server = serve(
        &app_config("inferencer:entry", "")
            .replace("port: 0}", "port: 0, drain_grace_period_s: 0.2}"),
        std::slice::from_ref(&marker),
    );
    let url = server.url.clone();
    let waiting = std::thread::spawn(move || request(&url, "/wait", "3", ""));
    std::thread::sleep(Duration::from_millis(800));
    let (exit, logs) = server.terminate();
    let (status, body) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}\n{logs}");
    assert_eq!(json(&body)["model"], "3");
    assert!(exit.success(), "{exit:?}\n{logs}");
    let left = common::processes_with(&marker);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_deployment_calls_another_applications_deployments_by_name_and_by_application() {
    let dir = apps_dir().display().to_string();
    let config = format!(
        "http_options: {{port: 0}}\napplications:\n  - name: adder\n    route_prefix: /adder\n    import_path: cross_app:adder\n    runtime_env: {{working_dir: {dir}}}\n  - name: caller\n    route_prefix: /\n    import_path: cross_app:caller\n    runtime_env: {{working_dir: {dir}}}\n"
    );
    let server = serve(&config, &[]);
    let (status, body) = request(&server.url, "/", "", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        json(&body),
        serde_json::json!({"by_name": 41, "ingress": 42})
    );
}
