//! Starting up: the server listens before its replicas have started, and `/-/healthz` says
//! which deployments are still loading; a replica that fails to start fails the start and
//! closes the port.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{echo, get};
use http::StatusCode;
use modelmux_front::Server;
use modelmux_serve::{Application, DeploymentSpec};
use tokio::sync::{Notify, oneshot};

/// An echo deployment whose replica starts only once `release` is notified.
fn held(name: &str, release: Arc<Notify>) -> DeploymentSpec {
    DeploymentSpec::new(name, move |_ctx| {
        let release = release.clone();
        async move {
            release.notified().await;
            Ok(common::Echo)
        }
    })
}

/// Waits (10 s at most) until `deployment` is the only one still loading.
async fn only_loading(addr: SocketAddr, deployment: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while get(addr, "/-/healthz", &[]).await.json()["loading"] != serde_json::json!([deployment]) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deployments before {deployment} never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A deployment whose replica fails to start once `release` is notified.
fn broken(release: Arc<Notify>) -> DeploymentSpec {
    DeploymentSpec::new("Broken", move |_ctx| {
        let release = release.clone();
        async move {
            release.notified().await;
            Err::<common::Echo, _>("the model file is missing".into())
        }
    })
}

/// Starts a server with `apps` in a task; returns its address once it listens, and the task
/// (which ends when the replicas have started, or failed to).
async fn listening(
    apps: Vec<Application>,
) -> (
    SocketAddr,
    tokio::task::JoinHandle<Result<Server, modelmux_serve::StartError>>,
) {
    let (tx, rx) = oneshot::channel();
    let mut builder = Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .on_listening(move |addr| {
            let _ = tx.send(addr);
        });
    for app in apps {
        builder = builder.application(app);
    }
    let task = tokio::spawn(builder.start());
    let addr = tokio::time::timeout(Duration::from_secs(10), rx)
        .await
        .expect("the server listens before its replicas start")
        .unwrap();
    (addr, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_lists_the_deployments_still_loading_while_the_port_is_open() {
    let release = Arc::new(Notify::new());
    let apps = vec![
        Application::new("fast")
            .route_prefix("/fast")
            .ingress(echo("Quick")),
        Application::new("slow")
            .route_prefix("/slow")
            .ingress(held("Big", release.clone())),
    ];
    let (addr, task) = listening(apps).await;
    // The fast deployment is up soon; the slow one is listed until it starts.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let health = loop {
        let health = get(addr, "/-/healthz", &[]).await;
        assert_eq!(
            health.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{}",
            health.text()
        );
        assert_eq!(health.json()["status"], "loading", "{}", health.text());
        if health.json()["loading"] == serde_json::json!(["slow/Big"]) {
            break health;
        }
        assert!(tokio::time::Instant::now() < deadline, "{}", health.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(get(addr, "/health", &[]).await.json(), health.json());
    assert!(!task.is_finished(), "start waits for every replica");
    release.notify_one();
    let server = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("start returns once the replicas have started")
        .unwrap()
        .unwrap();
    assert_eq!(server.local_addr(), addr);
    let health = get(addr, "/-/healthz", &[]).await;
    assert_eq!(health.status, StatusCode::OK, "{}", health.text());
    assert_eq!(get(addr, "/slow/x", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_fails_to_start_fails_the_start_and_closes_the_port() {
    let release = Arc::new(Notify::new());
    let failing = broken(release.clone());
    let (addr, task) = listening(vec![Application::new("app").ingress(failing)]).await;
    let health = get(addr, "/-/healthz", &[]).await;
    assert_eq!(health.json()["loading"], serde_json::json!(["app/Broken"]));
    release.notify_one();
    let Err(error) = task.await.unwrap() else {
        panic!("a replica failed to start, yet the server started")
    };
    assert!(
        error.to_string().contains("the model file is missing"),
        "{error}"
    );
    // The port is closed: connecting fails (or is reset) rather than hanging.
    let connect =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .expect("connecting does not hang");
    if let Ok(mut stream) = connect {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let _ = stream
            .write_all(b"GET /-/healthz HTTP/1.1\r\nhost: x\r\n\r\n")
            .await;
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
            .await
            .expect("no answer hangs");
        assert!(matches!(read, Ok(0) | Err(_)), "a stopped server answered");
    }
}

/// A deployment that passes each request on to `callee` through a handle.
fn caller(callee: &str) -> DeploymentSpec {
    let callee = callee.to_owned();
    DeploymentSpec::new("Caller", move |ctx| {
        let handle = ctx.handle(&callee);
        async move { Ok(Caller(handle?)) }
    })
}

struct Caller(modelmux_serve::DeploymentHandle);

impl modelmux_serve::Deployment for Caller {
    async fn call(
        &self,
        request: modelmux_serve::Request,
    ) -> Result<modelmux_serve::Response, modelmux_serve::BoxError> {
        Ok(self.0.call(request).await?)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_call_waits_for_the_replicas_still_starting() {
    // The ingress is up first and calls a deployment whose replica is still starting: its
    // call waits for that replica (it is not refused as "not served here", a cluster's answer).
    let release = Arc::new(Notify::new());
    let app = Application::new("app")
        .ingress(caller("Big"))
        .deployment(held("Big", release.clone()));
    let (addr, task) = listening(vec![app]).await;
    only_loading(addr, "app/Big").await;
    let early = tokio::spawn(async move { get(addr, "/x", &[]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !early.is_finished(),
        "the call was answered before its replica started"
    );
    release.notify_one();
    let answer = tokio::time::timeout(Duration::from_secs(10), early)
        .await
        .expect("the waiting call is answered once the replica starts")
        .unwrap();
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    let server = task.await.unwrap().unwrap();
    assert_eq!(get(addr, "/y", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_call_waiting_for_a_replica_that_fails_to_start_is_told_at_once() {
    let release = Arc::new(Notify::new());
    let failing = broken(release.clone());
    let app = Application::new("app")
        .ingress(caller("Broken"))
        .deployment(failing);
    let (addr, task) = listening(vec![app]).await;
    only_loading(addr, "app/Broken").await;
    let early = tokio::spawn(async move { get(addr, "/x", &[]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    release.notify_one();
    // The queue's timeout is 30 s: the answer comes well before it.
    let answer = tokio::time::timeout(Duration::from_secs(5), early)
        .await
        .expect("the waiting call is answered when the start fails")
        .unwrap();
    assert_eq!(
        answer.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        answer.text()
    );
    assert!(
        !answer.text().contains("not served here"),
        "a single node's answer names a cluster: {}",
        answer.text()
    );
    assert!(task.await.unwrap().is_err());
}
