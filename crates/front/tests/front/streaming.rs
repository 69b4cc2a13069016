//! A streamed response holds its replica slot until its last chunk is sent: on a replica with
//! one slot, the next request starts only after the stream before it has ended.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::get;
use http::StatusCode;
use modelmux_serve::{Body, BoxError, Deployment, DeploymentSpec, Request, Response};

/// Streams three chunks; the last waits for the test's gate. Logs `start N` when a call
/// begins and `end N` when its stream has sent everything.
struct Streamer {
    log: Arc<parking_lot::Mutex<Vec<String>>>,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Deployment for Streamer {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let seq = request
            .headers()
            .get("x-seq")
            .ok_or("no x-seq")?
            .to_str()?
            .to_string();
        self.log.lock().push(format!("start {seq}"));
        let (tx, body) = Body::channel(1);
        let (log, gate) = (self.log.clone(), self.gate.clone());
        tokio::spawn(async move {
            tx.send("one ").await?;
            tx.send("two ").await?;
            let _open = gate.acquire().await?;
            tx.send("three").await?;
            log.lock().push(format!("end {seq}"));
            Ok::<_, BoxError>(())
        });
        Ok(Response::new(body))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_body_keeps_its_slot_until_its_last_chunk() {
    let log: Arc<parking_lot::Mutex<Vec<String>>> = Arc::default();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (l, g) = (log.clone(), gate.clone());
    let spec = DeploymentSpec::new("Streamer", move |_ctx| {
        let (log, gate) = (l.clone(), g.clone());
        async move { Ok(Streamer { log, gate }) }
    })
    .max_ongoing_requests(1)
    .max_queued_requests(10);
    let server = common::serve(spec).await;
    let addr = server.local_addr();
    let first = tokio::spawn(async move { get(addr, "/", &[("x-seq", "1")]).await });
    let second = tokio::spawn(async move { get(addr, "/", &[("x-seq", "2")]).await });
    // Wait until both requests have started (the slot was let go with a stream still open) or
    // one runs and the other is queued behind it (the slot is held): no time bound decides.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if log.lock().len() == 2 {
            break;
        }
        let models = get(addr, "/-/models", &[]).await.json();
        let deployment = &models["applications"][0]["deployments"][0];
        if log.lock().len() == 1 && deployment["queued_requests"] == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{models}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    gate.add_permits(2);
    for (reply, seq) in [(first, 1), (second, 2)] {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "request {seq}");
        assert_eq!(reply.text(), "one two three", "request {seq}");
    }
    let log = log.lock().clone();
    // Whichever was sent first, its stream ended before the other started.
    assert!(
        log == ["start 1", "end 1", "start 2", "end 2"]
            || log == ["start 2", "end 2", "start 1", "end 1"],
        "a request started while the stream before it was still open: {log:?}"
    );
    server.shutdown().await;
}
