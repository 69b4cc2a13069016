//! A real S3-compatible server for tests (started by `./scripts/test`, found through
//! `MODELMUX_TEST_S3_ENDPOINT`), and a proxy in front of it that injects the faults real
//! networks and stores produce: 5xx answers, stalls in the middle of a body, truncated and
//! corrupted transfers, refusals. The proxy also counts requests, so tests can check that a
//! model was downloaded once.

#![allow(dead_code, unreachable_pub)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use modelmux_store::object_store::aws::AmazonS3Builder;
use modelmux_store::object_store::path::Path;
use modelmux_store::object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use parking_lot::Mutex;

/// The S3-compatible server the test command started. Fails (never skips) without one.
pub fn s3_endpoint() -> String {
    std::env::var("MODELMUX_TEST_S3_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "MODELMUX_TEST_S3_ENDPOINT is not set: these tests need an S3-compatible server. \
             ./scripts/test starts one (moto, from PyPI) and sets it; run that, or start one \
             yourself and export MODELMUX_TEST_S3_ENDPOINT=http://127.0.0.1:<port>"
        )
    })
}

/// A bucket of its own for each test, so tests run in parallel without seeing each other.
pub async fn new_bucket(endpoint: &str, name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let bucket = format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let addr: SocketAddr = endpoint.trim_start_matches("http://").parse().unwrap();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(
            http::Request::put(format!("/{bucket}"))
                .header("host", addr.to_string())
                .body(http_body_util::Empty::<Bytes>::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(
        response.status().is_success(),
        "create bucket: {}",
        response.status()
    );
    bucket
}

/// A client of the real server, for uploads.
pub fn client(endpoint: &str, bucket: &str) -> Arc<dyn ObjectStore> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Arc::new(
        AmazonS3Builder::new()
            .with_endpoint(endpoint)
            .with_bucket_name(bucket)
            .with_region("us-east-1")
            .with_access_key_id("test")
            .with_secret_access_key("test")
            .with_allow_http(true)
            .build()
            .unwrap(),
    )
}

pub async fn upload(store: &Arc<dyn ObjectStore>, key: &str, bytes: Vec<u8>) {
    store
        .put(&Path::parse(key).unwrap(), PutPayload::from(bytes))
        .await
        .unwrap();
}

/// What the proxy does to the next GETs of object bodies (HEADs are passed through unless
/// `status` is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status and no body.
    Status(u16),
    /// Send the headers and half the body, then nothing, forever.
    Stall,
    /// Announce the whole length, send half, close the connection.
    Truncate,
    /// Send the whole body with one byte flipped.
    Corrupt,
}

/// The proxy in front of the S3 server.
pub struct Proxy {
    pub endpoint: String,
    state: Arc<ProxyState>,
}

#[derive(Default)]
struct ProxyState {
    /// Faults for the next GETs, in order; `forever` applies after those run out.
    faults: Mutex<(Vec<Fault>, Option<Fault>)>,
    /// Statuses for the next HEADs, in order.
    head_faults: Mutex<Vec<u16>>,
    gets: Mutex<HashMap<String, u32>>,
    heads: AtomicU32,
}

impl Proxy {
    pub async fn start(upstream: &str) -> Proxy {
        let upstream: SocketAddr = upstream.trim_start_matches("http://").parse().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ProxyState::default());
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |request| {
                        let state = state.clone();
                        async move { Ok::<_, Infallible>(forward(&state, upstream, request).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Proxy {
            endpoint: format!("http://{addr}"),
            state,
        }
    }

    /// Injects `faults` into the next GETs, one each, then `forever` into all later ones.
    pub fn inject(&self, faults: &[Fault], forever: Option<Fault>) {
        *self.state.faults.lock() = (faults.iter().rev().copied().collect(), forever);
    }

    /// Answers the next HEADs with these statuses, one each.
    pub fn inject_head(&self, statuses: &[u16]) {
        *self.state.head_faults.lock() = statuses.iter().rev().copied().collect();
    }

    /// GETs of object bodies seen for keys ending in `suffix`.
    pub fn gets(&self, suffix: &str) -> u32 {
        self.state
            .gets
            .lock()
            .iter()
            .filter(|(path, _)| path.ends_with(suffix))
            .map(|(_, n)| n)
            .sum()
    }

    /// HEADs seen.
    pub fn heads(&self) -> u32 {
        self.state.heads.load(Ordering::Relaxed)
    }
}

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, std::io::Error>;

async fn forward(
    state: &ProxyState,
    upstream: SocketAddr,
    request: http::Request<Incoming>,
) -> http::Response<ProxyBody> {
    let is_get = request.method() == http::Method::GET;
    let path = request.uri().path().to_string();
    let fault = if is_get {
        *state.gets.lock().entry(path.clone()).or_default() += 1;
        let mut faults = state.faults.lock();
        faults.0.pop().or(faults.1)
    } else {
        if request.method() == http::Method::HEAD {
            state.heads.fetch_add(1, Ordering::Relaxed);
            state.head_faults.lock().pop().map(Fault::Status)
        } else {
            None
        }
    };
    if let Some(Fault::Status(code)) = fault {
        return http::Response::builder()
            .status(code)
            .body(full(Bytes::from_static(
                b"<Error><Code>Injected</Code></Error>",
            )))
            .unwrap();
    }
    // Forward as is (the S3 server checks no signatures), with the body read whole.
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let stream = tokio::net::TcpStream::connect(upstream).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let response = sender
        .send_request(http::Request::from_parts(parts, Full::new(body)))
        .await
        .unwrap();
    let (mut parts, body) = response.into_parts();
    let mut bytes = body.collect().await.unwrap().to_bytes().to_vec();
    let half = bytes.len() / 2;
    match fault {
        Some(Fault::Stall) => {
            let first = Bytes::copy_from_slice(&bytes[..half]);
            let stream = futures_util::stream::iter([Ok(Frame::data(first))])
                .chain(futures_util::stream::pending());
            http::Response::from_parts(parts, BodyExt::boxed(StreamBody::new(stream)))
        }
        Some(Fault::Truncate) => {
            let first = Bytes::copy_from_slice(&bytes[..half]);
            let stream = futures_util::stream::iter([
                Ok(Frame::data(first)),
                Err(std::io::Error::other("connection reset (injected)")),
            ]);
            http::Response::from_parts(parts, BodyExt::boxed(StreamBody::new(stream)))
        }
        Some(Fault::Corrupt) => {
            if let Some(b) = bytes.get_mut(half) {
                *b ^= 0x5a;
            }
            parts.headers.remove(http::header::CONTENT_LENGTH);
            http::Response::from_parts(parts, full(Bytes::from(bytes)))
        }
        _ => http::Response::from_parts(parts, full(Bytes::from(bytes))),
    }
}

fn full(bytes: Bytes) -> ProxyBody {
    BodyExt::boxed(Full::new(bytes).map_err(|never| match never {}))
}

/// Files under `dir`, recursively (the disk cache's `files/` and `tmp/`).
pub fn files_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                out.push((entry.path(), meta.len()));
            }
        }
    }
    out
}
