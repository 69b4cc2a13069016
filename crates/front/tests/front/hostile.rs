//! The front door against clients the HTTP/1 tests never were: HTTP/2 connections that open no
//! stream and only answer pings, and bodies announced and never sent (security review
//! T5-03, T5-04).

use crate::common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use common::{Counters, counted, echo, get, get_model, send, start};
use http::{Method, StatusCode};
use modelmux_front::{HttpOptions, Server};
use modelmux_serve::Application;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout};

/// What an HTTP/2 connection that never opens a stream saw before the server closed it.
#[derive(Debug, Default)]
struct IdleH2 {
    pings_answered: usize,
    goaway: bool,
}

/// Opens an HTTP/2 connection (preface and SETTINGS), answers every SETTINGS and PING the
/// server sends, and opens no stream: returns when the server closes the connection.
async fn idle_h2(addr: SocketAddr) -> IdleH2 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let mut seen = IdleH2::default();
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).await.is_err() {
            return seen;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).await.is_err() {
            return seen;
        }
        let (kind, ack) = (head[3], head[4] & 1 == 1);
        let answer: Vec<u8> = match kind {
            4 if !ack => b"\0\0\0\x04\x01\0\0\0\0".to_vec(),
            6 if !ack => {
                seen.pings_answered += 1;
                [&b"\0\0\x08\x06\x01\0\0\0\0"[..], &payload].concat()
            }
            7 => {
                seen.goaway = true;
                continue;
            }
            _ => continue,
        };
        if s.write_all(&answer).await.is_err() {
            return seen;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_http2_connections_are_closed_and_free_their_permits() {
    let mut options = HttpOptions::default();
    options.max_connections = 20;
    options.keep_alive_timeout = Duration::from_secs(2);
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let addr = server.local_addr();
    let begun = Instant::now();
    // Every permit taken by a connection that answers pings and never asks anything.
    let idle: Vec<_> = (0..20).map(|_| tokio::spawn(idle_h2(addr))).collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A new client waits for a permit, and gets one once the idle connections are closed:
    // within the keep-alive timeout and the watchdog's quarter more, plus the GOAWAY's round.
    let healthz = timeout(Duration::from_secs(6), get(addr, "/-/healthz", &[]))
        .await
        .expect("a new client was never answered while idle HTTP/2 connections held every permit");
    assert_eq!(healthz.status, StatusCode::OK);
    for conn in idle {
        let seen = timeout(Duration::from_secs(6), conn)
            .await
            .expect("an idle HTTP/2 connection was still open")
            .unwrap();
        assert!(
            seen.pings_answered >= 1,
            "{seen:?}: the server's pings were answered"
        );
        assert!(seen.goaway, "{seen:?}: closed with a GOAWAY");
    }
    assert!(
        begun.elapsed() >= Duration::from_secs(2),
        "closed before the keep-alive timeout: {:?}",
        begun.elapsed()
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_in_use_stays_open() {
    let mut options = HttpOptions::default();
    options.keep_alive_timeout = Duration::from_millis(800);
    let app = Application::new("a")
        .route_prefix("/stream")
        .ingress(common::trickle("Trickle", 20));
    let server = start(app, options).await;
    let stream = TcpStream::connect(server.local_addr()).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    let connection = tokio::spawn(conn);
    let uri = format!("http://{}/stream", server.local_addr());
    let request = || {
        http::Request::get(&uri)
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .unwrap()
    };
    // A stream that lasts 2 s, longer than the keep-alive timeout, then one request every
    // 300 ms for 3 s: the connection is used all along and stays open.
    let response = sender.send_request(request()).await.unwrap();
    let body = http_body_util::BodyExt::collect(response.into_body())
        .await
        .expect("the long stream was cut")
        .to_bytes();
    assert_eq!(
        body.len(),
        (0..20).map(|i: usize| format!("{i} ").len()).sum::<usize>()
    );
    for n in 0..10 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        timeout(Duration::from_secs(5), sender.ready())
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("the connection in use was closed before request {n}: {e}"));
        let response = timeout(Duration::from_secs(10), sender.send_request(request()))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("request {n} on the HTTP/2 connection: {e}"));
        assert_eq!(response.status(), StatusCode::OK);
        drop(response);
    }
    assert!(
        !connection.is_finished(),
        "the connection in use was closed"
    );
    // Left alone, it is closed as idle.
    timeout(Duration::from_secs(5), connection)
        .await
        .expect("the idle HTTP/2 connection was never closed")
        .unwrap()
        .unwrap();
    server.shutdown().await;
}

/// Sends a head announcing `length` bytes of body and nothing more, from `from`; the
/// connection, to keep it open.
async fn announce_body(addr: SocketAddr, from: IpAddr, length: usize) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(from, 0)).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    let head = format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n");
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_announced_and_not_sent_hold_no_budget() {
    // The defaults: 16 MiB bodies, a 256 MiB budget. Seventeen heads announce 16 MiB each.
    let server = start(
        Application::new("a").ingress(echo("Echo")),
        HttpOptions::default(),
    )
    .await;
    let addr = server.local_addr();
    let local = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut held = Vec::new();
    for _ in 0..17 {
        held.push(announce_body(addr, local, 16 << 20).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reply = send(addr, Method::POST, "/", &[], b"{\"inputs\": [[0.5]]}").await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    assert_eq!(reply.json()["body_len"], 19);
    drop(held);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_address_holds_at_most_its_share_of_the_body_budget() {
    let mut options = HttpOptions::default();
    options.max_body_bytes = 64 << 10;
    options.max_inflight_body_bytes = 256 << 10;
    let server = start(Application::new("a").ingress(echo("Echo")), options).await;
    let addr = server.local_addr();
    // 127.0.0.2 sends two bodies of 64 KiB but their last byte: its share (half, 128 KiB)
    // is nearly spent.
    let greedy = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = announce_body(addr, greedy, 64 << 10).await;
        s.write_all(&vec![b'x'; (64 << 10) - 1]).await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Its third body is refused...
    let mut third = announce_body(addr, greedy, 8 << 10).await;
    third.write_all(&[b'x'; 8 << 10]).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = timeout(Duration::from_secs(5), third.read(&mut answer))
        .await
        .expect("no answer to a body past the client's share")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("share"), "{answer}");
    // ...and another address's is served from the rest of the budget.
    static BODY: [u8; 60 << 10] = [b'y'; 60 << 10];
    let other = send(addr, Method::POST, "/", &[], &BODY).await;
    assert_eq!(other.status, StatusCode::OK, "{}", other.text());
    drop(held);
    server.shutdown().await;
}

/// A cluster node's server (node `n1`, cluster token `t`) with two replicas of a model cache.
async fn two_replicas(counters: Arc<Counters>) -> (Server, Vec<String>) {
    let spec = counted(
        "Model",
        counters,
        modelmux_cache::Multiplexer::builder().max_models(4),
        Duration::ZERO,
        Duration::ZERO,
    )
    .num_replicas(2);
    let server = Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .node_id("n1")
        .admin_token("t")
        .application(Application::new("a").ingress(spec))
        .start()
        .await
        .unwrap();
    let listing = get(
        server.local_addr(),
        "/-/models",
        &[("authorization", "Bearer t")],
    )
    .await
    .json();
    let replicas = listing["applications"][0]["deployments"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_string())
        .collect();
    (server, replicas)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_node_of_the_cluster_may_name_the_replica() {
    let counters = Arc::new(Counters::default());
    let (server, replicas) = two_replicas(counters.clone()).await;
    let addr = server.local_addr();
    let holder = get_model(addr, "m").await.replica();
    let other = replicas.iter().find(|r| **r != holder).unwrap().clone();
    let model = ("serve_multiplexed_model_id", "m");
    // A client naming the other replica is placed as any request: on the holder, no load.
    for forged in [vec![], vec![("x-modelmux-peer-token", "wrong")]] {
        let headers = [
            &[model, ("x-modelmux-forwarded", other.as_str())][..],
            &forged,
        ]
        .concat();
        let reply = get(addr, "/", &headers).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.replica(),
            holder,
            "{forged:?}: a client chose the replica"
        );
    }
    assert_eq!(counters.loads.load(Ordering::SeqCst), 1);
    // A node of the cluster (it holds the token) is honoured.
    let headers = [
        model,
        ("x-modelmux-forwarded", other.as_str()),
        ("x-modelmux-peer-token", "t"),
    ];
    let reply = get(addr, "/", &headers).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.replica(), other);
    assert_eq!(counters.loads.load(Ordering::SeqCst), 2);
    server.shutdown().await;
}

/// One HPACK-encoded GET of `path` (indexed `:method`, `:scheme`; literal `:path` and
/// `:authority` with indexed names, no Huffman coding), whose HEADERS frame ends the stream.
fn h2_get(stream: u32, path: &str) -> Vec<u8> {
    let mut block = vec![0x82, 0x86, 0x04, path.len() as u8];
    block.extend_from_slice(path.as_bytes());
    block.extend_from_slice(&[0x01, 1, b'x']);
    let len = (block.len() as u32).to_be_bytes();
    let mut frame = vec![len[1], len[2], len[3], 0x01, 0x05];
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(&block);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_connection_carries_at_most_its_cap_of_streams_at_once() {
    const CAP: usize = 1024;
    let app = Application::new("a").route_prefix("/stream").ingress(
        common::trickle("Trickle", 40)
            .max_ongoing_requests(4 * CAP)
            .max_queued_requests(4 * CAP),
    );
    let server = start(app, HttpOptions::default()).await;
    let mut s = TcpStream::connect(server.local_addr()).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    // The server's SETTINGS announce the cap; they apply once acknowledged.
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 4, "the server's first frame is its SETTINGS");
    let mut settings = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
    s.read_exact(&mut settings).await.unwrap();
    let announced = settings
        .chunks(6)
        .find(|s| u16::from_be_bytes([s[0], s[1]]) == 3)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
    assert_eq!(
        announced,
        Some(CAP as u32),
        "SETTINGS_MAX_CONCURRENT_STREAMS"
    );
    s.write_all(b"\0\0\0\x04\x01\0\0\0\0").await.unwrap();
    // 100 streams past the cap, all at once, on streams that last 4 s.
    let opened = CAP + 100;
    let frames: Vec<u8> = (0..opened as u32)
        .flat_map(|i| h2_get(2 * i + 1, "/stream"))
        .collect();
    s.write_all(&frames).await.unwrap();
    let (mut refused, mut answered) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(3);
    while refused + answered < opened && Instant::now() < deadline {
        let Ok(read) = timeout(Duration::from_secs(2), s.read_exact(&mut head)).await else {
            break;
        };
        read.unwrap();
        let mut payload = vec![0u8; u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize];
        s.read_exact(&mut payload).await.unwrap();
        match head[3] {
            // RST_STREAM with REFUSED_STREAM (7): not processed, the client may retry it.
            3 => {
                assert_eq!(payload, 7u32.to_be_bytes(), "the reset's error code");
                refused += 1;
            }
            1 => answered += 1,
            7 => panic!("the connection was closed (GOAWAY) rather than the streams refused"),
            _ => {}
        }
    }
    assert_eq!(
        (answered, refused),
        (CAP, opened - CAP),
        "streams answered and refused of {opened} opened at once"
    );
    server.shutdown().await;
}
