//! Who may use the admin API: a token when there is one; without one, only loopback, JSON
//! content types for calls that change state, and trusted `Host` names. And the drain: after
//! shutdown begins, readiness fails while requests are still served for the grace period.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{Counters, counted, get, get_model, send};
use http::{Method, StatusCode};
use modelmux_cache::Multiplexer;
use modelmux_front::{HttpOptions, Server};
use modelmux_serve::{Application, StartError};

fn app() -> Application {
    let spec = counted(
        "Model",
        Arc::new(Counters::default()),
        Multiplexer::builder().max_models(4),
        Duration::ZERO,
        Duration::ZERO,
    );
    Application::new("a").ingress(spec)
}

fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn a_tokenless_admin_api_is_not_exposed_beyond_loopback_unless_allowed() {
    let everywhere = SocketAddr::from(([0, 0, 0, 0], 0));
    let refused = Server::builder()
        .bind(everywhere)
        .application(app())
        .start()
        .await
        .err()
        .expect("started with an open admin API on 0.0.0.0");
    assert!(matches!(refused, StartError::OpenAdmin { .. }), "{refused}");
    assert!(refused.to_string().contains("admin token"), "{refused}");
    for builder in [
        Server::builder().allow_open_admin(),
        Server::builder().admin_token("t"),
    ] {
        let server = builder
            .bind(everywhere)
            .application(app())
            .start()
            .await
            .unwrap();
        server.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_token_state_changes_need_json_and_a_trusted_host() {
    let server = Server::builder()
        .bind(loopback())
        .allowed_hosts(["models.internal"])
        .application(app())
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();
    let load = "/-/models/Model/m1/load?pin=true";
    // A simple cross-site POST (no body, or a form) cannot pin a model.
    for headers in [
        vec![],
        vec![("content-type", "text/plain")],
        vec![("content-type", "application/x-www-form-urlencoded")],
    ] {
        let r = send(addr, Method::POST, load, &headers, b"").await;
        assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{headers:?}");
        assert!(r.text().contains("application/json"), "{}", r.text());
    }
    let r = send(addr, Method::DELETE, "/-/models/Model/m1", &[], b"").await;
    assert_eq!(r.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let r = send(addr, Method::POST, load, &[JSON], b"").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["pinned"], true);
    // Reading needs no content type.
    assert_eq!(get(addr, "/-/models", &[]).await.status, StatusCode::OK);
    // A rebound DNS name is refused, reading or writing; IPs, localhost and allowed names pass.
    for host in [
        "attacker.example",
        "attacker.example:8000",
        "localhost.attacker.example",
    ] {
        let r = send(addr, Method::GET, "/-/models", &[("host", host)], b"").await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host}");
        let r = send(addr, Method::POST, load, &[("host", host), JSON], b"").await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{host}");
    }
    for host in [
        "localhost:8000",
        "[::1]:8000",
        "10.1.2.3",
        "models.internal:8000",
    ] {
        let r = send(addr, Method::GET, "/-/models", &[("host", host)], b"").await;
        assert_eq!(r.status, StatusCode::OK, "{host}: {}", r.text());
    }
    // The application itself answers to any host.
    let r = get(
        addr,
        "/",
        &[
            ("host", "attacker.example"),
            ("serve_multiplexed_model_id", "m1"),
        ],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_token_every_model_endpoint_needs_it() {
    let server = Server::builder()
        .bind(loopback())
        .admin_token("s3cret")
        .application(app())
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();
    let load = "/-/models/Model/m1/load";
    let r = send(addr, Method::POST, load, &[JSON], b"").await;
    assert_eq!(
        r.status,
        StatusCode::UNAUTHORIZED,
        "JSON is no substitute for the token"
    );
    assert_eq!(
        get(addr, "/-/models", &[]).await.status,
        StatusCode::UNAUTHORIZED
    );
    let auth = ("authorization", "Bearer s3cret");
    assert_eq!(
        send(addr, Method::POST, load, &[auth], b"").await.status,
        StatusCode::OK,
        "with the token, no content type is needed"
    );
    // Probes and metrics stay open.
    assert_eq!(get(addr, "/-/healthz", &[]).await.status, StatusCode::OK);
    assert_eq!(get(addr, "/metrics", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_drain_grace_period_readiness_fails_and_requests_are_still_served() {
    let mut options = HttpOptions::default();
    options.drain_grace_period = Duration::from_millis(800);
    let server = Server::builder()
        .bind(loopback())
        .http_options(options)
        .application(app())
        .start()
        .await
        .unwrap();
    let addr = server.local_addr();
    assert_eq!(get(addr, "/-/healthz", &[]).await.status, StatusCode::OK);
    let stopping = tokio::spawn(server.shutdown());
    tokio::time::sleep(Duration::from_millis(50)).await;
    let health = get(addr, "/-/healthz", &[]).await;
    assert_eq!(health.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health.json()["status"], "draining");
    // New connections and requests are still taken.
    for i in 0..5 {
        let r = get_model(addr, &format!("m{i}")).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !stopping.is_finished(),
        "stopped before the grace period ended"
    );
    stopping.await.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "still listening after shutdown"
    );
}
