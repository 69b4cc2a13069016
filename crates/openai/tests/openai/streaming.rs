//! Streams and the engine controls, in process: the first streamed text goes out at once
//! whatever `stream_batching_interval_ms` is; an error after the stream began is one error
//! event, then `[DONE]`; pause, sleep and wake-up through the admin API. Pausing is also the
//! tests' way to hold a generation still, so that what they check is an order or a count,
//! never a duration.

use crate::common;

use std::net::SocketAddr;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// Sequences (waiting for admission, running) over every replica.
async fn sequences(addr: SocketAddr) -> (u64, u64) {
    let health = control(addr, "health").await.json();
    let replicas = health["replicas"].as_object().unwrap();
    let sum = |key: &str| -> u64 { replicas.values().map(|r| r[key].as_u64().unwrap()).sum() };
    (sum("sequences_waiting"), sum("sequences_running"))
}

/// Waits (bounded) until a request reaches an engine or `request` ends; then a paused or
/// asleep engine must hold it waiting, not admitted (the engine publishes its counts after
/// admission, so an engine that would run it never shows it waiting).
async fn held_waiting(addr: SocketAddr, request: &tokio::task::JoinHandle<Reply>) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let counts = loop {
        let counts = sequences(addr).await;
        if counts != (0, 0) || request.is_finished() {
            break counts;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the request never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(counts, (1, 0), "(waiting, running): admitted while held");
    assert!(!request.is_finished(), "answered while held");
}

/// An SSE answer read event by event, as it arrives.
struct EventStream {
    body: Incoming,
    buffer: String,
}

impl EventStream {
    async fn open(addr: SocketAddr, path: &str, request: Value) -> (u16, Self) {
        let stream = TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let request = hyper::Request::post(path)
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                serde_json::to_vec(&request).unwrap(),
            )))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body();
        (
            status,
            Self {
                body,
                buffer: String::new(),
            },
        )
    }

    /// The next event's `data:` payload; `None` at the end of the body.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data = event.trim_end().strip_prefix("data: ");
                return Some(
                    data.unwrap_or_else(|| panic!("not SSE: {event:?}"))
                        .to_owned(),
                );
            }
            let frame = self.body.frame().await?.unwrap();
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&data).unwrap());
            }
        }
    }

    /// Every event left.
    async fn rest(&mut self) -> Vec<String> {
        let mut events = Vec::new();
        while let Some(e) = self.next().await {
            events.push(e);
        }
        events
    }
}

/// The text a chat chunk carries, if any.
fn content(event: &str) -> Option<String> {
    let v: Value = serde_json::from_str(event).ok()?;
    v["choices"][0]["delta"]["content"]
        .as_str()
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

/// With text coalesced for a minute, the first text still goes out on its own, at once: the
/// client holds it while the sequence is still running (the engine is then paused, so the
/// sequence cannot finish before the check; 63 of its 64 tokens are still to come when the
/// first text is sent). The rest comes as one chunk when the sequence ends, long before the
/// minute is over. Coalescing the first text too would give one chunk of text, sent at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_streamed_text_is_not_held_back_by_the_batching_interval() {
    let config = config(json!({"experimental_configs": {"stream_batching_interval_ms": 60_000}}));
    let server = serve(&config, 1).await;
    let addr = server.local_addr();
    let question = "What is the capital of France?";
    let mut request = chat("smollm2", question, 64, true);
    request["ignore_eos"] = json!(true);
    let (status, mut stream) =
        EventStream::open(addr, "/v1/chat/completions", request.clone()).await;
    assert_eq!(status, 200);
    let role = stream.next().await.unwrap();
    assert_eq!(content(&role), None, "{role}");
    let first = stream.next().await.unwrap();
    let first_text = content(&first).unwrap_or_else(|| panic!("not text: {first}"));
    assert_eq!(control(addr, "pause").await.status, 200);
    assert_eq!(
        sequences(addr).await,
        (0, 1),
        "the first text arrived before the sequence ended"
    );
    assert_eq!(control(addr, "resume").await.status, 200);
    let rest = stream.rest().await;
    let texts: Vec<String> = rest.iter().filter_map(|e| content(e)).collect();
    assert_eq!(texts.len(), 1, "the rest is coalesced: {rest:?}");
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    // The same text as the whole answer.
    let mut request = chat("smollm2", question, 64, false);
    request["ignore_eos"] = json!(true);
    let whole = post(addr, "/v1/chat/completions", request).await.json();
    assert_eq!(
        whole["choices"][0]["message"]["content"],
        format!("{first_text}{}", texts[0])
    );
    server.shutdown().await;
}

/// Once the first byte of a stream went out (the chat's first chunk, with the assistant's
/// role, sent before the engine admits the sequence) the status cannot change: a failure then
/// (here: the engine is paused, so the request waits past `queue_timeout_s` and is refused as
/// overloaded) is one `data: {"error": ...}` event with the error's code, then `[DONE]`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_after_the_first_streamed_byte_is_one_error_event_then_done() {
    let config = config(json!({"engine_kwargs": {"queue_timeout_s": 0.2}}));
    let server = serve(&config, 1).await;
    let addr = server.local_addr();
    assert_eq!(control(addr, "pause").await.status, 200);
    let (status, mut stream) =
        EventStream::open(addr, "/v1/chat/completions", chat("smollm2", "Hi", 4, true)).await;
    assert_eq!(status, 200, "the stream began before the failure");
    let first: Value = serde_json::from_str(&stream.next().await.unwrap()).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "{first}");
    let rest = stream.rest().await;
    assert_eq!(rest.len(), 2, "one error event, then [DONE]: {rest:?}");
    let error: Value = serde_json::from_str(&rest[0]).unwrap();
    assert_eq!(error["error"]["code"], 503, "{error}");
    // It names the request, as the chunks' ids do (`chatcmpl-<request id>`).
    let chunk_id = first["id"].as_str().unwrap();
    assert_eq!(
        error["error"]["request_id"].as_str(),
        chunk_id.strip_prefix("chatcmpl-"),
        "{error}"
    );
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no KV cache room or sequence slot"),
        "{error}"
    );
    assert_eq!(rest[1], "[DONE]");
    // The refused request is gone (the engine publishes its counts just after failing it).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while sequences(addr).await != (0, 0) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the refused request stays"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generation_pauses_and_resumes_through_the_admin_api() {
    let server = serve(&config(json!({})), 2).await;
    let addr = server.local_addr();
    let paused = control(addr, "pause").await;
    assert_eq!(
        paused.status,
        200,
        "{}",
        String::from_utf8_lossy(&paused.body)
    );
    let replicas = paused.json()["replicas"].as_object().unwrap().clone();
    assert_eq!(replicas.len(), 2);
    assert!(
        replicas.values().all(|r| r["paused"] == true),
        "{replicas:?}"
    );
    let request = tokio::spawn(async move {
        post(
            addr,
            "/v1/chat/completions",
            chat("smollm2", "Hi", 4, false),
        )
        .await
    });
    held_waiting(addr, &request).await;
    assert_eq!(control(addr, "resume").await.status, 200);
    let answer = request.await.unwrap();
    assert_eq!(answer.status, 200);

    // Asleep, the weights are gone and requests wait; awake, they are answered the same.
    let asleep = control(addr, "sleep").await;
    assert_eq!(
        asleep.status,
        200,
        "{}",
        String::from_utf8_lossy(&asleep.body)
    );
    let replicas = asleep.json()["replicas"].as_object().unwrap().clone();
    assert!(
        replicas.values().all(|r| r["asleep"] == true),
        "the answer comes once the weights are released: {replicas:?}"
    );
    let request = tokio::spawn(async move {
        post(
            addr,
            "/v1/chat/completions",
            chat("smollm2", "Hi", 4, false),
        )
        .await
    });
    held_waiting(addr, &request).await;
    let awake = control(addr, "wakeup").await;
    assert_eq!(
        awake.status,
        200,
        "{}",
        String::from_utf8_lossy(&awake.body)
    );
    assert!(
        awake.json()["replicas"]
            .as_object()
            .unwrap()
            .values()
            .all(|r| r["asleep"] == false)
    );
    let again = request.await.unwrap();
    assert_eq!(again.status, 200);
    assert_eq!(
        again.json()["choices"],
        answer.json()["choices"],
        "same weights, same answer"
    );
    assert_eq!(control(addr, "no_such_control").await.status, 404);
    server.shutdown().await;
}

/// Ray's `sleep` then `wakeup` through the admin API with no traffic at all, on two replicas,
/// twice: `wakeup` answers within seconds with every replica awake, and a request is then
/// answered at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wakeup_with_no_traffic_answers_within_seconds() {
    let server = serve(&config(json!({})), 2).await;
    let addr = server.local_addr();
    for round in 0..2 {
        let asleep = control(addr, "sleep").await;
        assert_eq!(asleep.status, 200, "round {round}");
        // Ray's is_sleeping says so on every replica.
        let sleeping = control(addr, "is_sleeping").await.json();
        assert!(
            sleeping["replicas"]
                .as_object()
                .unwrap()
                .values()
                .all(|r| r["asleep"] == true),
            "{sleeping}"
        );
        // At once in round 0 (the engine has just released its weights), after a quiet
        // while in round 1 (it waits on its queue).
        tokio::time::sleep(std::time::Duration::from_millis(300 * round)).await;
        let started = tokio::time::Instant::now();
        let awake =
            tokio::time::timeout(std::time::Duration::from_secs(10), control(addr, "wakeup"))
                .await
                .unwrap_or_else(|_| {
                    panic!("round {round}: wakeup with no traffic did not answer in 10 s")
                });
        assert_eq!(
            awake.status,
            200,
            "{}",
            String::from_utf8_lossy(&awake.body)
        );
        assert!(
            awake.json()["replicas"]
                .as_object()
                .unwrap()
                .values()
                .all(|r| r["asleep"] == false),
            "{:?}",
            awake.json()
        );
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        let answer = post(
            addr,
            "/v1/chat/completions",
            chat("smollm2", "Hi", 2, false),
        )
        .await;
        assert_eq!(answer.status, 200);
    }
    server.shutdown().await;
}
