//! Redirects on remote fetches (security review T5-15): a repository's server that answers
//! with a redirect to another host (here another port of loopback: another origin) must not
//! send the fetch there (blind SSRF: the cloud metadata service, an admin port). The fetch
//! fails at once with an error naming both URLs, and the other host sees no connection. A
//! redirect within the repository's origin is still followed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use modelmux_cache::ModelId;
use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions, RetryPolicy};

const BODY: &[u8] = b"not really a model, but 35 bytes.\n";

/// A web server on loopback: `/redirect/...` answers 302 to `target` + the same path,
/// `/same/...` answers 302 to `/files/...` on itself, everything else is [`BODY`]. Counts the
/// connections it accepts and the requests it answers.
struct Web {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
}

async fn web(target: Option<SocketAddr>) -> Web {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (accepted, answered) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let answered = answered.clone();
            let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
                answered.fetch_add(1, Ordering::SeqCst);
                let path = request.uri().path().to_string();
                let response = if let Some(rest) = path.strip_prefix("/redirect") {
                    let to = target.map_or(String::new(), |t| format!("http://{t}"));
                    redirect(format!("{to}/plain{rest}?sig=secret"))
                } else if let Some(rest) = path.strip_prefix("/same") {
                    redirect(format!("/files{rest}"))
                } else {
                    hyper::Response::builder()
                        .header("content-length", BODY.len())
                        .header("etag", "\"abc\"")
                        .header("last-modified", "Wed, 02 Dec 2026 00:00:00 GMT")
                        .body(Full::new(Bytes::from_static(BODY)))
                        .unwrap()
                };
                async move { Ok::<_, Infallible>(response) }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    Web {
        addr,
        connections,
        requests,
    }
}

fn redirect(location: String) -> hyper::Response<Full<Bytes>> {
    hyper::Response::builder()
        .status(302)
        .header("location", location)
        .header("content-length", 0)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

fn options(cache: &DiskCache, s3_endpoint: Option<SocketAddr>) -> RepositoryOptions {
    let mut options = RepositoryOptions {
        disk_cache: Some(cache.clone()),
        // Several attempts allowed: a refused redirect must not use them.
        retry: RetryPolicy {
            attempts: 4,
            backoff_base: std::time::Duration::from_secs(2),
            ..RetryPolicy::default()
        },
        ..Default::default()
    };
    if let Some(endpoint) = s3_endpoint {
        options.options = [
            ("endpoint", format!("http://{endpoint}")),
            ("region", "us-east-1".into()),
            ("access_key_id", "test".into()),
            ("secret_access_key", "test".into()),
            ("allow_http", "true".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    }
    options
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_to_another_host_is_refused_and_that_host_never_contacted() {
    let other = web(None).await;
    let repo = web(Some(other.addr)).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path().join("c"), 1 << 20).unwrap();
    let id = ModelId::new("m").unwrap();

    // A web-server repository and an S3 one (path-style requests to the same server, whose
    // bucket is `redirect`): both clients refuse.
    let repositories = [
        ModelRepository::open(
            &format!("http://{}/redirect", repo.addr),
            options(&cache, None),
        )
        .unwrap(),
        ModelRepository::open("s3://redirect/models", options(&cache, Some(repo.addr))).unwrap(),
    ];
    for repository in &repositories {
        let started = tokio::time::Instant::now();
        let size = repository.size(&id, "model.onnx").await.unwrap_err();
        let fetch = repository.fetch(&id, "model.onnx").await.err().unwrap();
        for err in [size.to_string(), fetch.to_string()] {
            assert!(err.contains("redirect to"), "{err}");
            assert!(
                err.contains(&format!("http://{}/plain/", other.addr)),
                "{err}"
            );
            assert!(
                err.contains(&format!("http://{}/redirect", repo.addr)),
                "{err}"
            );
            assert!(err.contains("not followed"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
        // Refused at once, not retried after backoffs.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
    assert!(repo.requests.load(Ordering::SeqCst) >= 4);
    assert_eq!(
        other.connections.load(Ordering::SeqCst),
        0,
        "the other host was contacted"
    );
    assert_eq!(cache.stats().downloads, 0);

    // A redirect within the repository's origin is followed.
    let same = ModelRepository::open(&format!("http://{}/same", repo.addr), options(&cache, None))
        .unwrap();
    let file = same.fetch(&id, "model.onnx").await.unwrap();
    assert_eq!(file.bytes().await.unwrap(), BODY);
    assert_eq!(other.connections.load(Ordering::SeqCst), 0);
}
