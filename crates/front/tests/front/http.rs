//! The serve layer over real HTTP: an in-process server on an ephemeral port, a real client.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Counters, counted, echo, get, get_model, send};
use http::{Method, StatusCode};
use modelmux_cache::Multiplexer;
use modelmux_front::Server;
use modelmux_serve::{
    Application, Body, BoxError, Deployment, DeploymentHandle, DeploymentSpec, Request, Response,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn localhost() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

async fn start(app: Application) -> Server {
    Server::builder()
        .bind(localhost())
        .application(app)
        .start()
        .await
        .unwrap()
}

/// `/health` is the readiness probe's name in vLLM and most load balancers: it answers as
/// `/-/healthz` does, even with an application at `/` (which would otherwise take it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_as_healthz_even_beside_an_application_at_the_root() {
    let server = start(Application::new("default").ingress(echo("Echo"))).await;
    let addr = server.local_addr();
    let health = get(addr, "/health", &[]).await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
    assert_eq!(health.json(), serde_json::json!({"status": "ok"}));
    assert_eq!(health.json(), get(addr, "/-/healthz", &[]).await.json());
    assert_eq!(health.replica(), "", "no application answered /health");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_request_loads_once_then_is_served_from_cache_by_the_same_replica() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(3),
        ms(50),
        ms(0),
    )
    .num_replicas(2);
    let server = start(Application::new("default").ingress(spec)).await;
    let addr = server.local_addr();
    let first = get_model(addr, "1").await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(first.json()["model_id"], "1");
    for _ in 0..5 {
        let again = get_model(addr, "1").await;
        assert_eq!(
            again.replica(),
            first.replica(),
            "served by the replica holding it"
        );
    }
    assert_eq!(counters.loads.load(Ordering::SeqCst), 1);
    server.shutdown().await;
    assert_eq!(
        counters.unloads.load(Ordering::SeqCst),
        1,
        "shutdown unloads the model"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_id_headers_request_ids_bodies_and_headers_reach_the_deployment() {
    let server = start(Application::new("a").ingress(echo("Echo"))).await;
    let addr = server.local_addr();

    let r = send(
        addr,
        Method::POST,
        "/x/y",
        &[("serve-multiplexed-model-id", "m-7"), ("x-custom", "hi")],
        b"12345",
    )
    .await;
    let j = r.json();
    assert_eq!(
        (
            j["model_id"].as_str(),
            j["method"].as_str(),
            j["path"].as_str()
        ),
        (Some("m-7"), Some("POST"), Some("/x/y"))
    );
    assert_eq!(
        (j["body_len"].as_u64(), j["x_custom"].as_str()),
        (Some(5), Some("hi"))
    );
    assert!(!r.replica().is_empty(), "x-modelmux-replica is set");
    // Two spellings naming two models: refused, never one of them silently.
    let spoofed = send(
        addr,
        Method::POST,
        "/",
        &[
            ("serve_multiplexed_model_id", "tenant-a"),
            ("serve-multiplexed-model-id", "tenant-b"),
        ],
        b"",
    )
    .await;
    assert_eq!(spoofed.status, StatusCode::BAD_REQUEST);
    assert!(
        spoofed.text().contains("two different models"),
        "{}",
        spoofed.text()
    );
    let generated = r.headers["x-request-id"].to_str().unwrap();
    assert_eq!(
        j["request_id"].as_str(),
        Some(generated),
        "the deployment sees the id the client gets"
    );

    let r = get(addr, "/", &[("x-request-id", "client-chose-this")]).await;
    assert_eq!(r.headers["x-request-id"], "client-chose-this");
    assert_eq!(
        r.json()["model_id"],
        serde_json::Value::Null,
        "no header: a normal request"
    );
    let r = get(addr, "/", &[("serve_multiplexed_model_id", "")]).await;
    assert_eq!(r.json()["model_id"], serde_json::Value::Null);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_input_gets_4xx_with_a_json_body() {
    let server = Server::builder()
        .bind(localhost())
        .max_body_bytes(1000)
        .application(
            Application::new("a")
                .route_prefix("/api")
                .ingress(echo("Echo")),
        )
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();

    let long = "x".repeat(300);
    let r = get(addr, "/api", &[("serve_multiplexed_model_id", &long)]).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["type"], "invalid_model_id");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("300 bytes"),
        "{}",
        r.text()
    );

    let r = get(addr, "/elsewhere", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json()["error"]["type"], "no_route");
    assert!(
        r.headers.contains_key("x-request-id"),
        "errors carry the request id too"
    );

    static BIG: [u8; 2000] = [b'x'; 2000];
    let r = send(addr, Method::POST, "/api", &[], &BIG).await;
    assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(r.json()["error"]["type"], "payload_too_large");

    let r = get(addr, "/-/nothing-here", &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_user_code_is_a_500_and_the_replica_keeps_serving() {
    let server = start(Application::new("a").ingress(echo("Echo"))).await;
    let addr = server.local_addr();
    let r = get(addr, "/", &[("x-panic", "1")]).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.json()["error"]["type"], "deployment_panicked");
    assert!(r.text().contains("asked to panic"), "{}", r.text());
    let ok = get(addr, "/", &[]).await;
    assert_eq!((ok.status, ok.replica()), (StatusCode::OK, r.replica()));
    server.shutdown().await;
}

/// Sends one chunk, waits for a go-ahead, sends another: proves chunks reach the client as
/// they are produced.
struct Streamer {
    go: Arc<tokio::sync::Notify>,
}

impl Deployment for Streamer {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let (tx, body) = Body::channel(4);
        let go = self.go.clone();
        tokio::spawn(async move {
            tx.send("data: first\n\n").await?;
            go.notified().await;
            tx.send("data: second\n\n").await?;
            Ok::<_, BoxError>(())
        });
        let mut response = Response::new(body);
        response.headers_mut().insert(
            "content-type",
            http::HeaderValue::from_static("text/event-stream"),
        );
        Ok(response)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_responses_arrive_chunk_by_chunk() {
    use http_body_util::BodyExt;
    let go = Arc::new(tokio::sync::Notify::new());
    let spec = {
        let go = go.clone();
        DeploymentSpec::new("Stream", move |_| {
            let go = go.clone();
            async move { Ok(Streamer { go }) }
        })
    };
    let server = start(Application::new("a").ingress(spec)).await;
    let stream = tokio::net::TcpStream::connect(server.local_addr())
        .await
        .unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = hyper::Request::get("/")
        .header("host", "x")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    let mut body = sender.send_request(request).await.unwrap().into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(
        first, "data: first\n\n",
        "the first event arrives while the second is not yet produced"
    );
    go.notify_one();
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(second, "data: second\n\n");
    server.shutdown().await;
}

/// The guide's model composition: Upstream calls Downstream with model id "bar".
struct Upstream {
    downstream: DeploymentHandle,
}

impl Deployment for Upstream {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let with_model = self
            .downstream
            .options()
            .multiplexed_model_id("bar")?
            .call(Request::new(Body::empty()))
            .await?;
        let without = self.downstream.call(Request::new(Body::empty())).await?;
        let read = |r: Response| async move {
            let bytes = r.into_body().to_bytes(1 << 20).await?;
            Ok::<_, BoxError>(
                serde_json::from_slice::<serde_json::Value>(&bytes)?["model_id"].clone(),
            )
        };
        Ok(Response::new(Body::json(&serde_json::json!({
            "upstream": modelmux_context::multiplexed_model_id().map(|m| m.to_string()),
            "downstream_with_option": read(with_model).await?,
            "downstream_without": read(without).await?,
        }))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handles_set_the_callees_model_id_without_touching_the_callers() {
    let upstream = DeploymentSpec::new("Upstream", |ctx| async move {
        Ok(Upstream {
            downstream: ctx.handle("Downstream")?,
        })
    });
    let app = Application::new("composed")
        .deployment(echo("Downstream"))
        .ingress(upstream);
    let server = start(app).await;
    let r = get_model(server.local_addr(), "foo").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let j = r.json();
    assert_eq!(j["upstream"], "foo", "the caller's own id is unchanged");
    assert_eq!(j["downstream_with_option"], "bar");
    assert_eq!(
        j["downstream_without"],
        serde_json::Value::Null,
        "nested calls do not inherit the id"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_first_requests_triggers_one_load_on_one_replica() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(4),
        ms(200),
        ms(0),
    )
    .num_replicas(4)
    .max_ongoing_requests(200);
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    // Uneven model counts first (three replicas hold one model, one holds none): a torn view
    // of the counts is what once let two racing first requests place a model twice.
    for warm in ["warm-0", "warm-1", "warm-2"] {
        assert_eq!(get_model(addr, warm).await.status, StatusCode::OK);
    }
    for round in 0..4 {
        let before = counters.loads.load(Ordering::SeqCst);
        let cold = format!("cold-{round}");
        let burst: Vec<_> = (0..100)
            .map(|_| {
                let cold = cold.clone();
                tokio::spawn(async move { get_model(addr, &cold).await })
            })
            .collect();
        let mut replicas = std::collections::HashSet::new();
        for r in burst {
            let r = r.await.unwrap();
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
            replicas.insert(r.replica());
        }
        assert_eq!(
            counters.loads.load(Ordering::SeqCst) - before,
            1,
            "round {round}: one load for the whole burst"
        );
        assert_eq!(replicas.len(), 1, "round {round}: {replicas:?}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_holders_get_a_second_copy() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(2),
        ms(20),
        ms(800),
    )
    .num_replicas(2)
    .max_ongoing_requests(1);
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    // Warm `hot` on one replica (the second request measures its 800 ms service time), then
    // two at once: the holder is busy with the first, and waiting for it would take longer
    // than the 20 ms load, so the second gets a copy on the other replica.
    let warm = get_model(addr, "hot").await;
    assert_eq!(get_model(addr, "hot").await.replica(), warm.replica());
    let (a, b) = tokio::join!(get_model(addr, "hot"), async {
        tokio::time::sleep(ms(200)).await;
        get_model(addr, "hot").await
    });
    assert_eq!((a.status, b.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(a.replica(), warm.replica());
    assert_ne!(
        b.replica(),
        a.replica(),
        "a second copy on the other replica"
    );
    assert_eq!(counters.loads.load(Ordering::SeqCst), 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_queue_bound_requests_get_503_with_retry_after() {
    let counters = Arc::new(Counters::default());
    let spec = counted("Model", counters, Multiplexer::builder(), ms(0), ms(400))
        .max_ongoing_requests(1)
        .max_queued_requests(1);
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    let requests: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(async move {
                tokio::time::sleep(ms(30 * i)).await;
                get_model(addr, "m").await
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for r in requests {
        let r = r.await.unwrap();
        if r.status == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(r.json()["error"]["type"], "overloaded");
            assert_eq!(r.headers["retry-after"], "1");
        }
        statuses.push(r.status.as_u16());
    }
    statuses.sort();
    assert_eq!(
        statuses,
        [200, 200, 503],
        "one running, one queued, one refused"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_health_routes_models_prewarm_pin_evict_and_token() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder().max_models(2),
        ms(10),
        ms(0),
    )
    .num_replicas(2);
    let server = Server::builder()
        .bind(localhost())
        .admin_token("s3cret")
        .application(Application::new("default").route_prefix("/m").ingress(spec))
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();
    let auth = [("authorization", "Bearer s3cret")];

    assert_eq!(get(addr, "/-/healthz", &[]).await.status, StatusCode::OK);
    assert_eq!(
        get(addr, "/-/routes", &[]).await.json(),
        serde_json::json!({"/m": "default"})
    );
    let r = get(addr, "/-/models", &[]).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(r.json()["error"]["type"], "unauthorized");
    assert_eq!(
        get(addr, "/-/models", &[("authorization", "Bearer wrong")])
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );

    let r = send(
        addr,
        Method::POST,
        "/-/models/Model/org%2Fadapter-1/load?pin=true",
        &auth,
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let pinned_on = r.json()["replica"].as_str().unwrap().to_string();
    assert_eq!(counters.loads.load(Ordering::SeqCst), 1);
    // Requests for it now go where it was prewarmed: no second load.
    let served = get(
        addr,
        "/m",
        &[("serve_multiplexed_model_id", "org/adapter-1")],
    )
    .await;
    assert_eq!(served.replica(), pinned_on);
    assert_eq!(counters.loads.load(Ordering::SeqCst), 1);

    let listing = get(addr, "/-/models", &auth).await.json();
    let replicas = listing["applications"][0]["deployments"][0]["replicas"]
        .as_array()
        .unwrap()
        .clone();
    let holder = replicas
        .iter()
        .find(|r| r["id"] == pinned_on.as_str())
        .unwrap();
    assert_eq!(holder["loaded"][0]["id"], "org/adapter-1");
    assert_eq!(holder["loaded"][0]["pinned"], true);
    assert!(holder["loaded"][0]["idle_seconds"].as_f64().is_some());

    let r = send(
        addr,
        Method::DELETE,
        "/-/models/Model/org%2Fadapter-1",
        &auth,
        b"",
    )
    .await;
    assert_eq!(r.json()["evicted_from"], serde_json::json!([pinned_on]));
    let r = send(
        addr,
        Method::DELETE,
        "/-/models/Model/org%2Fadapter-1",
        &auth,
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(addr, Method::POST, "/-/models/NoSuch/x/load", &auth, b"").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = send(addr, Method::PUT, "/-/models/Model/x", &auth, b"").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    server.shutdown().await;
    assert_eq!(counters.unloads.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_in_prometheus_format_with_deployment_and_replica_labels() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters,
        Multiplexer::builder().max_models(1),
        ms(1),
        ms(0),
    );
    let server = start(Application::new("default").ingress(spec)).await;
    let addr = server.local_addr();
    for id in ["a", "a", "b"] {
        assert_eq!(get_model(addr, id).await.status, StatusCode::OK);
    }
    tokio::time::sleep(ms(50)).await; // let `a`'s unload finish
    let page = get(addr, "/metrics", &[]).await;
    assert_eq!(
        page.headers["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let text = page.text();
    let m = modelmux_promtext::parse(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
    let replica = m
        .samples("modelmux_replica_ongoing_requests")
        .next()
        .unwrap();
    assert!(
        replica.label("replica").unwrap().starts_with("Model#"),
        "{text}"
    );
    let ours = [("app", "default"), ("deployment", "Model")];
    assert_eq!(
        replica.labels[..2],
        ours.map(|(k, v)| (k.into(), v.into())),
        "{text}"
    );
    // Each series once, with the replica's labels, at exactly what three gets (a, a, b with
    // room for one model) did: two loads, one hit, one eviction and its unload.
    let one = |name: &str| {
        m.value(name, &ours)
            .unwrap_or_else(|| panic!("no {name} in\n{text}"))
    };
    for (class, n) in [
        ("1xx", 0.0),
        ("2xx", 3.0),
        ("3xx", 0.0),
        ("4xx", 0.0),
        ("5xx", 0.0),
    ] {
        let status = [ours[0], ours[1], ("status", class)];
        assert_eq!(
            m.value("modelmux_requests_total", &status),
            Some(n),
            "{class}"
        );
    }
    for (name, n) in [
        ("modelmux_model_loads_total", 2.0),
        ("modelmux_cache_hits_total", 1.0),
        ("modelmux_cache_misses_total", 2.0),
        ("modelmux_model_unloads_total", 1.0),
        ("modelmux_model_evictions_total", 1.0),
        ("modelmux_model_load_failures_total", 0.0),
        ("modelmux_model_unload_failures_total", 0.0),
        ("modelmux_model_loads_abandoned_total", 0.0),
        ("modelmux_models_loaded", 1.0),
        ("modelmux_models_loading", 0.0),
        ("modelmux_replica_ongoing_requests", 0.0),
        ("modelmux_deployment_queued_requests", 0.0),
    ] {
        assert_eq!(one(name), n, "{name}:\n{text}");
    }
    for (name, n) in [
        ("modelmux_request_duration_seconds", 3.0),
        ("modelmux_model_load_duration_seconds", 2.0),
        ("modelmux_model_unload_duration_seconds", 1.0),
    ] {
        let h = m.histogram(name, &ours).unwrap();
        assert_eq!(h.count, n, "{name}");
        assert_eq!(h.buckets.last(), Some(&(f64::INFINITY, n)), "{name}");
        assert!(
            h.buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "{name}: cumulative"
        );
        assert!(h.sum > 0.0, "{name}");
        assert_eq!(m.kind(name), Some("histogram"));
    }
    // Only `b` is loaded now, not pinned.
    let loaded: Vec<_> = m
        .samples("modelmux_model_loaded")
        .map(|s| (s.label("model").unwrap(), s.value))
        .collect();
    assert_eq!(loaded, [("b", 1.0)]);
    assert_eq!(
        m.value("modelmux_model_pinned", &[("model", "b")]),
        Some(0.0)
    );
    assert_eq!(m.kind("modelmux_requests_total"), Some("counter"));
    assert_eq!(m.kind("modelmux_models_loaded"), Some("gauge"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_requests_in_flight_finish_then_unloads() {
    let counters = Arc::new(Counters::default());
    let spec = counted(
        "Model",
        counters.clone(),
        Multiplexer::builder(),
        ms(0),
        ms(300),
    );
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    let in_flight = tokio::spawn(async move { get_model(addr, "m").await });
    until_in_flight(addr).await;
    server.shutdown().await;
    let r = in_flight.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(counters.unloads.load(Ordering::SeqCst), 1);
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "no longer listening"
    );
}

/// Fails its health check once told to.
struct Sickly {
    sick: Arc<std::sync::atomic::AtomicBool>,
}

impl Deployment for Sickly {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        Ok(Response::new(Body::from("ok")))
    }

    async fn check_health(&self) -> Result<(), BoxError> {
        if self.sick.swap(false, Ordering::SeqCst) {
            Err("out of sorts".into())
        } else {
            Ok(())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_failing_its_health_check_is_replaced() {
    let sick = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spec = {
        let sick = sick.clone();
        DeploymentSpec::new("Sickly", move |_| {
            let sick = sick.clone();
            async move { Ok(Sickly { sick }) }
        })
        .health_check(ms(50), ms(500))
    };
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    let before = get(addr, "/", &[]).await.replica();
    sick.store(true, Ordering::SeqCst);
    // Checked every 50 ms: a fresh replica takes over within a few checks (a bounded wait,
    // not a fixed one, for a busy machine).
    let deadline = tokio::time::Instant::now() + ms(5000);
    loop {
        let after = get(addr, "/", &[]).await;
        assert_eq!(after.status, StatusCode::OK);
        if after.replica() != before {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no fresh replica took over"
        );
        tokio::time::sleep(ms(20)).await;
    }
    server.shutdown().await;
}

/// Waits, then calls Downstream: in flight when shutdown starts, it must still get through.
struct LateCaller {
    downstream: DeploymentHandle,
}

impl Deployment for LateCaller {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        tokio::time::sleep(ms(300)).await;
        let response = self.downstream.call(Request::new(Body::empty())).await?;
        Ok(Response::new(Body::from(format!(
            "downstream said {}",
            response.status()
        ))))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_requests_in_flight_call_other_deployments() {
    let upstream = DeploymentSpec::new("Upstream", |ctx| async move {
        Ok(LateCaller {
            downstream: ctx.handle("Downstream")?,
        })
    });
    let server = start(
        Application::new("a")
            .deployment(echo("Downstream"))
            .ingress(upstream),
    )
    .await;
    let addr = server.local_addr();
    let in_flight = tokio::spawn(async move { get(addr, "/", &[]).await });
    until_in_flight(addr).await;
    server.shutdown().await;
    let r = in_flight.await.unwrap();
    assert_eq!(
        (r.status, r.text().as_str()),
        (StatusCode::OK, "downstream said 200 OK")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_replacement_fails_keeps_serving() {
    let built = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sick = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spec = {
        let (built, sick) = (built.clone(), sick.clone());
        DeploymentSpec::new("Sickly", move |_| {
            let (built, sick) = (built.clone(), sick.clone());
            async move {
                if built.fetch_add(1, Ordering::SeqCst) > 0 {
                    return Err::<Sickly, BoxError>("no GPU left for a second instance".into());
                }
                Ok(Sickly { sick })
            }
        })
        .health_check(ms(50), ms(500))
    };
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    sick.store(true, Ordering::SeqCst);
    let deadline = tokio::time::Instant::now() + ms(5000);
    while built.load(Ordering::SeqCst) < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no replacement was attempted"
        );
        tokio::time::sleep(ms(10)).await;
    }
    // Through the failed replacement and after it, the old replica stays in rotation.
    let until = tokio::time::Instant::now() + ms(300);
    while tokio::time::Instant::now() < until {
        let r = get(addr, "/", &[]).await;
        assert_eq!(
            r.status,
            StatusCode::OK,
            "the old replica is still in rotation: {}",
            r.text()
        );
        tokio::time::sleep(ms(20)).await;
    }
    assert_eq!(get(addr, "/-/healthz", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_does_not_leak_its_replica_slot() {
    let counters = Arc::new(Counters::default());
    // Work of 30 s: only a slot given back when the client goes (not when the work ends)
    // comes back within the bound below, however slow the machine.
    let spec = counted("Model", counters, Multiplexer::builder(), ms(0), ms(30_000))
        .max_ongoing_requests(1)
        .max_queued_requests(0);
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    {
        use tokio::io::AsyncWriteExt;
        let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
        raw.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nserve_multiplexed_model_id: m\r\n\r\n")
            .await
            .unwrap();
        // Held until the request has its slot.
        let deadline = tokio::time::Instant::now() + ms(5000);
        while common::ongoing_requests(addr).await.0 != 1 {
            assert!(tokio::time::Instant::now() < deadline, "never took a slot");
            tokio::time::sleep(ms(5)).await;
        }
    } // the client goes away mid-request: hyper drops the request's future
    // The slot comes back when the future is dropped, long before the 30 s of work would
    // have ended (measured: within a few ms).
    let gone = tokio::time::Instant::now();
    loop {
        let (n, listing) = common::ongoing_requests(addr).await;
        if n == 0 {
            break;
        }
        assert!(
            gone.elapsed() < ms(10_000),
            "the slot did not come back: {listing}"
        );
        tokio::time::sleep(ms(5)).await;
    }
    // With one slot and no queue, a leaked slot would make the next request a 503 at once;
    // given the slot, it is still working a second later.
    match tokio::time::timeout(ms(1000), get_model(addr, "m")).await {
        Err(_) => {}
        Ok(answer) => panic!("the next request got {} instead of the slot", answer.status),
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_too_long_in_the_queue_gets_503() {
    let counters = Arc::new(Counters::default());
    let spec = counted("Model", counters, Multiplexer::builder(), ms(0), ms(600))
        .max_ongoing_requests(1)
        .queue_timeout(ms(100));
    let server = start(Application::new("a").ingress(spec)).await;
    let addr = server.local_addr();
    let first = tokio::spawn(async move { get_model(addr, "m").await });
    tokio::time::sleep(ms(100)).await;
    let second = get_model(addr, "m").await;
    assert_eq!(second.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(second.json()["error"]["type"], "queue_timeout");
    assert!(second.headers.contains_key("retry-after"));
    assert_eq!(first.await.unwrap().status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_prefixes_under_the_admin_api_are_refused() {
    let err = Server::builder()
        .bind(localhost())
        .application(
            Application::new("a")
                .route_prefix("/-/mine")
                .ingress(echo("Echo")),
        )
        .start()
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("reserved"), "{err}");
}

/// A deployment with one control: `bump` adds the body's number to a counter of its replica.
struct Bumped(std::sync::atomic::AtomicU64);

impl Deployment for Bumped {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        Ok(Response::new(Body::from(
            self.0.load(Ordering::SeqCst).to_string(),
        )))
    }

    async fn control(&self, name: &str, body: bytes::Bytes) -> Result<serde_json::Value, BoxError> {
        match name {
            "bump" => {
                let by: u64 = std::str::from_utf8(&body)?.trim().parse()?;
                Ok(serde_json::json!({"now": self.0.fetch_add(by, Ordering::SeqCst) + by}))
            }
            "explode" => panic!("control exploded"),
            other => Err(format!("no control {other}").into()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_controls_run_on_every_replica_behind_the_admin_token() {
    let spec = DeploymentSpec::new("Bumped", |_ctx| async {
        Ok(Bumped(std::sync::atomic::AtomicU64::new(0)))
    })
    .num_replicas(3);
    let server = Server::builder()
        .bind(localhost())
        .admin_token("s3cret")
        .application(Application::new("default").ingress(spec))
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();
    let auth = [("authorization", "Bearer s3cret")];
    let path = "/-/deployments/Bumped/controls/bump";
    let r = send(addr, Method::POST, path, &[], b"2").await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = send(addr, Method::POST, path, &auth, b"2").await;
    assert_eq!(r.status, StatusCode::OK);
    let replicas = r.json()["replicas"].as_object().unwrap().clone();
    assert_eq!(replicas.len(), 3);
    assert!(replicas.values().all(|v| v["now"] == 2), "{replicas:?}");
    // Every replica was bumped: whichever serves the next request says 2.
    assert_eq!(get(addr, "/", &[]).await.text(), "2");
    let r = send(
        addr,
        Method::POST,
        "/-/deployments/Bumped/controls/bump",
        &auth,
        b"x",
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    let r = send(
        addr,
        Method::POST,
        "/-/deployments/Bumped/controls/explode",
        &auth,
        b"",
    )
    .await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(r.text().contains("control exploded"), "{}", r.text());
    let r = send(
        addr,
        Method::POST,
        "/-/deployments/Nobody/controls/bump",
        &auth,
        b"1",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // The replicas survived the panic.
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

/// Waits (bounded) until a request is in flight on one of the server's replicas.
async fn until_in_flight(addr: std::net::SocketAddr) {
    let deadline = tokio::time::Instant::now() + ms(5000);
    loop {
        let (ongoing, listing) = common::ongoing_requests(addr).await;
        if ongoing > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no request in flight: {listing}"
        );
        tokio::time::sleep(ms(5)).await;
    }
}
