//! The front door against slow, idle, greedy and impatient clients, over real sockets: each
//! limit in `HttpOptions` is shown to hold.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{echo, get, send, start};
use http::{Method, StatusCode};
use modelmux_front::{HttpOptions, Server};
use modelmux_serve::{Application, Body, BoxError, Deployment, DeploymentSpec, Request, Response};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A GET of `uri` with no body, for a hyper client connection.
fn empty_get(uri: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(uri)
        .body(http_body_util::Empty::new())
        .unwrap()
}

/// The default options with these two timeouts.
fn timeouts(header_read: Duration, keep_alive: Duration) -> HttpOptions {
    let mut options = HttpOptions::default();
    options.header_read_timeout = header_read;
    options.keep_alive_timeout = keep_alive;
    options
}

/// Reads until the server closes the connection (or errors); what it sent.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return out,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// A deployment that takes `delay` per request and counts requests whose work was dropped
/// before it finished (cancelled).
struct Slow {
    delay: Duration,
    started: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

struct CountDrop(Arc<AtomicUsize>, bool);

impl Drop for CountDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Deployment for Slow {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        self.started.fetch_add(1, Ordering::SeqCst);
        let mut guard = CountDrop(self.cancelled.clone(), false);
        tokio::time::sleep(self.delay).await;
        guard.1 = true;
        Ok(Response::new(Body::from("done")))
    }
}

fn slow(delay: Duration) -> (DeploymentSpec, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let started = Arc::new(AtomicUsize::new(0));
    let cancelled = Arc::new(AtomicUsize::new(0));
    let (s, c) = (started.clone(), cancelled.clone());
    let spec = DeploymentSpec::new("Slow", move |_ctx| {
        let (started, cancelled) = (s.clone(), c.clone());
        async move {
            Ok(Slow {
                delay,
                started,
                cancelled,
            })
        }
    })
    .max_ongoing_requests(1000);
    (spec, started, cancelled)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowloris_connections_are_cut_off_within_the_header_timeout() {
    let options = timeouts(ms(400), Duration::from_secs(60));
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let addr = server.local_addr();
    let begun = Instant::now();
    // Half a header each, and then a byte every 100 ms: activity never stops, the head never
    // completes.
    let mut clients = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .unwrap();
        clients.push(s);
    }
    let drip = tokio::spawn(async move {
        let mut closed = 0;
        while closed < clients.len() {
            closed = 0;
            for c in &mut clients {
                if c.write_all(b"a").await.is_err() {
                    closed += 1;
                    continue;
                }
                let mut buf = [0u8; 64];
                match timeout(ms(1), c.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => closed += 1,
                    _ => {}
                }
            }
            tokio::time::sleep(ms(100)).await;
        }
        Instant::now()
    });
    let all_closed = timeout(Duration::from_secs(10), drip)
        .await
        .expect("slow clients were still connected 10 s later")
        .unwrap();
    let took = all_closed - begun;
    assert!(
        took < Duration::from_secs(4),
        "200 slow-header clients cut off after {took:?} with a 400 ms header timeout"
    );
    // The server still serves.
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

/// The default timeouts, where the keep-alive one (5 s) is shorter than the header read one
/// (10 s): half a head and then silence must be cut off by the header timeout. (Closing it as
/// idle instead was a graceful shutdown that hyper held open for the head: forever.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_half_heads_are_cut_off_under_the_default_timeouts() {
    let options = HttpOptions::default();
    assert!(options.keep_alive_timeout < options.header_read_timeout);
    let header_read = options.header_read_timeout;
    // The watchdog's stated slack: a quarter of the shorter timeout.
    let slack = options.keep_alive_timeout.min(header_read) / 4;
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let addr = server.local_addr();
    let begun = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        waits.push(tokio::spawn(async move {
            read_until_closed(&mut s).await;
            Instant::now()
        }));
    }
    // A second late head, on a connection that has served one request already.
    let mut again = TcpStream::connect(addr).await.unwrap();
    again
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 4096];
    assert!(again.read(&mut buf).await.unwrap() > 0);
    let second_begun = Instant::now();
    again
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    // One second of margin for a loaded machine, on top of the stated slack.
    let bound = header_read + slack + Duration::from_secs(1);
    for wait in waits {
        let closed = timeout(bound + Duration::from_secs(5), wait)
            .await
            .expect("a silent half head was still connected long after the header timeout")
            .unwrap();
        let took = closed - begun;
        assert!(
            took >= header_read && took <= bound,
            "closed after {took:?}; header timeout {header_read:?}, bound {bound:?}"
        );
    }
    let closed = timeout(
        bound + Duration::from_secs(5),
        read_until_closed(&mut again),
    )
    .await;
    assert!(closed.is_ok(), "a silent later head was never cut off");
    let took = second_begun.elapsed();
    assert!(took >= header_read && took <= bound, "{took:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_are_closed_after_the_keep_alive_timeout() {
    let options = timeouts(Duration::from_secs(60), ms(500));
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let addr = server.local_addr();
    let mut clients = Vec::new();
    for i in 0..1000 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        if i % 2 == 0 {
            // Half of them first finish a keep-alive request, then go quiet.
            s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
        }
        clients.push(s);
    }
    let begun = Instant::now();
    let closed = futures_util::future::join_all(clients.into_iter().map(|mut s| async move {
        timeout(Duration::from_secs(10), read_until_closed(&mut s))
            .await
            .is_ok()
    }))
    .await;
    let took = begun.elapsed();
    assert!(
        closed.iter().all(|c| *c),
        "{} of 1000 idle connections were still open after 10 s",
        closed.iter().filter(|c| !**c).count()
    );
    assert!(
        took < Duration::from_secs(5),
        "idle connections took {took:?} to close with a 500 ms keep-alive timeout"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_connection_is_not_mistaken_for_an_idle_one() {
    let mut options = HttpOptions::default();
    options.keep_alive_timeout = ms(200);
    let (spec, started, cancelled) = slow(ms(700));
    let server = start(Application::new("a").ingress(spec), options).await;
    // Two requests that each take longer than the keep-alive timeout, one after the other on
    // the same connection: neither is cut, and the second is served on that connection.
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    for n in 1..=2 {
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let response = timeout(Duration::from_secs(10), read_response(&mut s))
            .await
            .unwrap_or_else(|_| panic!("no answer to request {n}"));
        assert!(
            response.starts_with("HTTP/1.1 200") && response.ends_with("done"),
            "request {n}: {response:?}"
        );
        assert_eq!(started.load(Ordering::SeqCst), n);
    }
    assert_eq!(cancelled.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}

/// Reads one whole response with a `content-length` (head and body) from `stream`; what was
/// read so far if the connection closes first.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&out).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>())
                })
                .and_then(Result::ok)
                .unwrap_or(0);
            if out.len() >= end + 4 + length {
                return text;
            }
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return text,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_and_frees() {
    let mut options = HttpOptions::default();
    options.max_connections = 4;
    options.keep_alive_timeout = Duration::from_secs(60);
    options.header_read_timeout = Duration::from_secs(60);
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let addr = server.local_addr();
    let mut hogs = Vec::new();
    for _ in 0..4 {
        hogs.push(TcpStream::connect(addr).await.unwrap());
    }
    // Let the server accept all four before the fifth arrives.
    tokio::time::sleep(ms(100)).await;
    let fifth = tokio::spawn(async move { get(addr, "/", &[]).await.status });
    tokio::time::sleep(ms(500)).await;
    assert!(
        !fifth.is_finished(),
        "a fifth connection was served while four were open under a cap of four"
    );
    drop(hogs.pop());
    let status = timeout(Duration::from_secs(5), fifth)
        .await
        .expect("the fifth connection was not served once one closed")
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_does_not_arrive_in_time_gets_408() {
    let mut options = HttpOptions::default();
    options.body_read_timeout = ms(300);
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    let begun = Instant::now();
    s.write_all(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let reply = timeout(Duration::from_secs(5), read_until_closed(&mut s))
        .await
        .expect("the connection stayed open");
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"body_read_timeout\""), "{text}");
    assert!(begun.elapsed() < Duration::from_secs(3));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_its_timeout_gets_504_and_its_work_is_cancelled() {
    let mut options = HttpOptions::default();
    options.request_timeout = Some(ms(200));
    let (spec, started, cancelled) = slow(Duration::from_secs(5));
    let server = start(Application::new("a").ingress(spec), options).await;
    let begun = Instant::now();
    let reply = get(server.local_addr(), "/", &[]).await;
    assert_eq!(
        reply.status,
        StatusCode::GATEWAY_TIMEOUT,
        "{}",
        reply.text()
    );
    assert_eq!(reply.json()["error"]["type"], "request_timeout");
    assert!(begun.elapsed() < Duration::from_secs(2));
    assert_eq!(started.load(Ordering::SeqCst), 1);
    assert_eq!(
        cancelled.load(Ordering::SeqCst),
        1,
        "the deployment's work was not dropped"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_past_the_inflight_cap_are_shed_at_once_and_probes_still_answer() {
    let mut options = HttpOptions::default();
    options.max_inflight_requests = 3;
    let (spec, started, _) = slow(ms(3000));
    let server = start(Application::new("a").ingress(spec), options).await;
    let addr = server.local_addr();
    let busy: Vec<_> = (0..3)
        .map(|_| tokio::spawn(async move { get(addr, "/", &[]).await.status }))
        .collect();
    while started.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(ms(10)).await;
    }
    let shed = get(addr, "/", &[]).await;
    assert_eq!(
        shed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        shed.text()
    );
    assert_eq!(shed.json()["error"]["type"], "server_overloaded");
    assert!(shed.headers.contains_key("retry-after"));
    // Refused while all three still run: it did not wait for one of them to end.
    assert!(
        busy.iter().all(|b| !b.is_finished()),
        "shedding waited for a slot instead of refusing at once"
    );
    assert_eq!(get(addr, "/-/healthz", &[]).await.status, StatusCode::OK);
    for b in busy {
        assert_eq!(b.await.unwrap(), StatusCode::OK);
    }
    assert_eq!(get(addr, "/", &[]).await.status, StatusCode::OK);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_share_a_byte_budget() {
    let mut options = HttpOptions::default();
    options.max_body_bytes = 4096;
    options.max_inflight_body_bytes = 8192;
    // Every body here comes from one address: let it have the whole budget (the shares are
    // `hostile.rs`'s).
    options.max_inflight_body_bytes_per_client = Some(8192);
    let (spec, started, _) = slow(ms(1500));
    let server = start(Application::new("a").ingress(spec), options).await;
    let addr = server.local_addr();
    static BODY: [u8; 4000] = [b'x'; 4000];
    let holding: Vec<_> = (0..2)
        .map(|_| tokio::spawn(async move { send(addr, Method::POST, "/", &[], &BODY).await }))
        .collect();
    while started.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(ms(10)).await;
    }
    let refused = send(addr, Method::POST, "/", &[], &BODY).await;
    assert_eq!(refused.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.json()["error"]["type"], "server_overloaded");
    // Bodiless requests are not counted.
    let (small_started, small) = (started.load(Ordering::SeqCst), get(addr, "/", &[]));
    assert_eq!(small.await.status, StatusCode::OK);
    assert!(started.load(Ordering::SeqCst) > small_started);
    for h in holding {
        assert_eq!(h.await.unwrap().status, StatusCode::OK);
    }
    // The budget was given back.
    assert_eq!(
        send(addr, Method::POST, "/", &[], &BODY).await.status,
        StatusCode::OK
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_that_cannot_work_refuse_to_start() {
    let mut options = HttpOptions::default();
    options.max_inflight_body_bytes = options.max_body_bytes - 1;
    let error = Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .http_options(options)
        .application(Application::new("a").ingress(echo("Echo")))
        .start()
        .await
        .err()
        .expect("started");
    assert!(
        error.to_string().contains("max_inflight_body_bytes"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_streaming_past_the_header_timeout_keeps_its_connection() {
    let options = timeouts(ms(300), Duration::from_secs(60));
    let spec = common::trickle("Trickle", 12);
    let server = start(Application::new("a").ingress(spec), options).await;
    // Two 1.2 s streams, one after the other on one HTTP/1.1 connection: neither is cut, and
    // the connection is kept for the second.
    let stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    for n in 1..=2 {
        timeout(Duration::from_secs(10), sender.ready())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the connection was closed before request {n}: {e}"));
        let request = empty_get("http://x/");
        let response = timeout(Duration::from_secs(10), sender.send_request(request))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {n}: {e}"));
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .unwrap_or_else(|e| panic!("stream {n} was cut: {e}"))
            .to_bytes();
        assert_eq!(body, "0 1 2 3 4 5 6 7 8 9 10 11 ", "stream {n}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_outlives_the_header_timeout_between_requests() {
    let options = timeouts(ms(200), Duration::from_secs(60));
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    // A cluster peer's connection: HTTP/2 without TLS, pinged every second by the server,
    // quiet between forwarded requests for longer than the (HTTP/1) header timeout.
    let stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(conn);
    for n in 1..=3 {
        let request = empty_get(&format!("http://{}/", server.local_addr()));
        let response = timeout(Duration::from_secs(10), sender.send_request(request))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {n} on the HTTP/2 connection: {e}"));
        assert_eq!(response.status(), StatusCode::OK);
        tokio::time::sleep(ms(1500)).await;
    }
    assert!(
        !connection.is_finished(),
        "the HTTP/2 connection was closed"
    );
    server.shutdown().await;
}
