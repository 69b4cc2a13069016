//! The dashboard's server side: the page and its files with headers that keep other origins
//! out, and `/-/dashboard/state` behind the admin token, whose series come from the ring
//! of samples (requests/s, hit ratio, loads/s, latency percentiles, checked against the
//! exact counts of the traffic sent) and whose models are
//! `/-/models`'. (The page itself is checked in a real browser by `crates/cli/tests`.)

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{Counters, counted, get};
use http::StatusCode;
use modelmux_cache::Multiplexer;
use modelmux_front::Server;
use modelmux_serve::Application;

const AUTH: [(&str, &str); 1] = [("authorization", "Bearer s3cret")];

async fn start() -> Server {
    let spec = counted(
        "Model",
        Arc::new(Counters::default()),
        Multiplexer::builder().max_models(2),
        Duration::from_millis(5),
        Duration::from_millis(2),
    );
    Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .admin_token("s3cret")
        .application(Application::new("default").ingress(spec))
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_and_its_files_are_served_and_may_not_be_framed() {
    let server = start().await;
    let addr = server.local_addr();
    for (path, kind) in [
        ("/-/dashboard", "text/html"),
        ("/-/dashboard/", "text/html"),
        ("/-/dashboard/app.js", "text/javascript"),
        ("/-/dashboard/app.css", "text/css"),
        ("/-/dashboard/uplot.js", "text/javascript"),
        ("/-/dashboard/uplot.css", "text/css"),
    ] {
        // No token needed for the files: they hold no state.
        let reply = get(addr, path, &[]).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
        let header = |name: &str| reply.headers[name].to_str().unwrap().to_owned();
        assert!(header("content-type").starts_with(kind), "{path}");
        assert!(header("content-security-policy").contains("frame-ancestors 'none'"));
        assert_eq!(header("x-frame-options"), "DENY");
        assert!(!reply.body.is_empty(), "{path} is empty");
    }
    let page = get(addr, "/-/dashboard", &[]).await.text();
    assert!(
        page.contains("app.js") && !page.contains("<script>"),
        "the page loads its script from a file (the policy forbids inline scripts)"
    );
    assert_eq!(
        get(addr, "/-/dashboard/nothing.js", &[]).await.status,
        StatusCode::NOT_FOUND
    );
    server.shutdown().await;
}

/// The same document without its idle times (which move between two reads).
fn without_idle(mut v: serde_json::Value) -> serde_json::Value {
    match &mut v {
        serde_json::Value::Object(m) => {
            m.remove("idle_seconds");
            for value in m.values_mut() {
                *value = without_idle(value.take());
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                *item = without_idle(item.take());
            }
        }
        _ => {}
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_is_behind_the_token_and_reports_rates_from_the_ring() {
    let server = start().await;
    let addr = server.local_addr();
    let refused = get(addr, "/-/dashboard/state", &[]).await;
    assert_eq!(
        refused.status,
        StatusCode::UNAUTHORIZED,
        "{}",
        refused.text()
    );
    // The first read starts the sampling; traffic starts once the ring has two points, so
    // every request falls in an interval the series report.
    let first = get(addr, "/-/dashboard/state", &AUTH).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    let times = |state: &serde_json::Value| -> Vec<f64> {
        (state["deployments"][0]["t"].as_array())
            .map(|t| t.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default()
    };
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let until_sampled_after = |after: f64| async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let state = get(addr, "/-/dashboard/state", &AUTH).await.json();
            if times(&state).last().is_some_and(|t| *t > after) {
                return state;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no sample after {after}: {state}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    until_sampled_after(0.0).await;
    // Traffic over three models in turn with room for two: every request misses (a least
    // recently used cache cycled through one more model than it holds), loads and evicts.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(3500);
    let mut sent = 0;
    while tokio::time::Instant::now() < deadline {
        let model = ["m1", "m2", "m3"][sent % 3];
        let reply = get(addr, "/", &[("serve_multiplexed_model_id", model)]).await;
        assert_eq!(reply.status, StatusCode::OK);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let state = until_sampled_after(unix()).await;
    assert_eq!(
        without_idle(state["models"].clone()),
        without_idle(get(addr, "/-/models", &AUTH).await.json()),
        "models are /-/models'"
    );
    let series = &state["deployments"][0];
    assert_eq!(series["app"], "default");
    assert_eq!(series["deployment"], "Model");
    // Each entry, null where an interval had nothing to divide by.
    let values = |key: &str| -> Vec<Option<f64>> {
        let pointer = format!("/{}", key.replace('.', "/"));
        series
            .pointer(&pointer)
            .unwrap_or_else(|| panic!("{key} in {series}"))
            .as_array()
            .unwrap()
            .iter()
            .map(serde_json::Value::as_f64)
            .collect()
    };
    let t = times(&state);
    assert!(t.len() >= 3, "{series}");
    assert!(t.windows(2).all(|w| w[1] > w[0]));
    // A rate over each interval times its length, summed: every request counted once (the
    // first interval, before the traffic, has none; the times are rounded to the ms).
    let total = |key: &str| -> f64 {
        let rates = values(key);
        assert_eq!(rates.len(), t.len(), "{key}");
        assert_eq!(rates[0], Some(0.0), "{key} before the traffic");
        (1..t.len())
            .map(|i| rates[i].unwrap() * (t[i] - t[i - 1]))
            .sum()
    };
    let close = |got: f64, want: usize, what: &str| {
        assert!((got - want as f64).abs() < 0.5, "{what}: {got} for {want}");
    };
    close(total("requests_per_second"), sent, "requests");
    close(
        total("loads_per_second"),
        sent,
        "loads (every request missed)",
    );
    close(total("evictions_per_second"), sent - 2, "evictions");
    // Every interval with lookups had no hit; one without any has none to report.
    let hits: Vec<f64> = values("hit_ratio").into_iter().flatten().collect();
    assert!(
        !hits.is_empty() && hits.iter().all(|h| *h == 0.0),
        "{hits:?}"
    );
    let errors: Vec<f64> = values("error_ratio").into_iter().flatten().collect();
    assert!(
        !errors.is_empty() && errors.iter().all(|e| *e == 0.0),
        "{errors:?}"
    );
    // In milliseconds: each request loads (5 ms) and infers (2 ms), so its bucket is 5-10 ms.
    let p50: Vec<f64> = values("latency_ms.p50").into_iter().flatten().collect();
    let p99: Vec<f64> = values("latency_ms.p99").into_iter().flatten().collect();
    assert!(
        !p50.is_empty() && p50.iter().all(|p| *p >= 5.0 && *p < 1000.0),
        "{p50:?}"
    );
    assert!(p50.iter().zip(&p99).all(|(a, b)| a <= b));
    assert!(series["llm"].is_null());
    server.shutdown().await;
}

/// A model evicted while a request uses it is reported `draining` (in `/-/models`, so on the
/// dashboard) until that request is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_evicted_in_use_is_reported_draining_until_its_request_ends() {
    let spec = counted(
        "Model",
        Arc::new(Counters::default()),
        Multiplexer::builder().max_models(2),
        Duration::from_millis(1),
        Duration::from_millis(600),
    );
    let server = Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .admin_token("s3cret")
        .application(Application::new("default").ingress(spec))
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();
    let slow = tokio::spawn(async move {
        get(addr, "/", &[("serve_multiplexed_model_id", "m1")])
            .await
            .status
    });
    // Evicted once the request holds m1 (loaded, in use).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let models = get(addr, "/-/models", &AUTH).await.json();
        let in_use = models["applications"][0]["deployments"][0]["replicas"][0]["loaded"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| m["id"] == "m1" && m["in_use"].as_u64().unwrap_or(0) > 0);
        if in_use {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "m1 never in use: {models}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let evicted = common::send(
        addr,
        http::Method::DELETE,
        "/-/models/Model/m1",
        &[AUTH[0], ("content-type", "application/json")],
        b"",
    )
    .await;
    assert_eq!(evicted.status, StatusCode::OK, "{}", evicted.text());
    let draining = |models: &serde_json::Value| {
        models["applications"][0]["deployments"][0]["replicas"][0]["draining"].clone()
    };
    let models = get(addr, "/-/models", &AUTH).await.json();
    assert_eq!(draining(&models), serde_json::json!(["m1"]), "{models}");
    assert_eq!(
        draining(&get(addr, "/-/dashboard/state", &AUTH).await.json()["models"]),
        serde_json::json!(["m1"])
    );
    assert_eq!(slow.await.unwrap(), StatusCode::OK);
    // The unload runs on a task of its own once the request lets go.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let models = get(addr, "/-/models", &AUTH).await.json();
        if draining(&models).is_null() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still draining: {models}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.shutdown().await;
}
