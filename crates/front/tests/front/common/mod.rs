//! Test deployments and a small HTTP client for the serve integration tests.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use modelmux_cache::{Model, ModelId, Multiplexer, MultiplexerBuilder};
use modelmux_serve::{
    Body, BoxError, Deployment, DeploymentSpec, ReplicaContext, Request, Response,
};
use tokio::net::TcpStream;

/// A response as the tests see it.
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.body))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn replica(&self) -> String {
        self.headers
            .get("x-modelmux-replica")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }
}

/// Sends one request on a fresh connection.
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &'static [u8],
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut request = hyper::Request::builder().method(method).uri(path);
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        request = request.header("host", addr.to_string());
    }
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::from_static(body))).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    send(addr, Method::GET, path, headers, b"").await
}

pub async fn get_model(addr: SocketAddr, model: &str) -> Reply {
    get(addr, "/", &[("serve_multiplexed_model_id", model)]).await
}

fn json_response(value: serde_json::Value) -> Response {
    Response::new(Body::json(&value))
}

/// Echoes what it sees: model id, request id, method, path, body length, a header.
pub struct Echo;

impl Deployment for Echo {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        if request.headers().contains_key("x-panic") {
            panic!("asked to panic");
        }
        let custom = request
            .headers()
            .get("x-custom")
            .map(|v| v.to_str().unwrap().to_string());
        let body_len = request.body().as_full().map_or(0, <[u8]>::len);
        Ok(json_response(serde_json::json!({
            "model_id": modelmux_context::multiplexed_model_id().map(|m| m.to_string()),
            "request_id": modelmux_context::request_id().map(|r| r.to_string()),
            "method": request.method().as_str(),
            "path": request.uri().path(),
            "body_len": body_len,
            "x_custom": custom,
        })))
    }
}

/// Streams `chunks` chunks, one every 100 ms.
pub struct Trickle {
    chunks: usize,
}

impl Deployment for Trickle {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let (tx, body) = Body::channel(1);
        let chunks = self.chunks;
        tokio::spawn(async move {
            for i in 0..chunks {
                tokio::time::sleep(Duration::from_millis(100)).await;
                tx.send(format!("{i} ")).await?;
            }
            Ok::<_, BoxError>(())
        });
        Ok(Response::new(body))
    }
}

/// A deployment of [`Trickle`]s of `chunks` chunks.
pub fn trickle(name: &str, chunks: usize) -> DeploymentSpec {
    DeploymentSpec::new(name, move |_ctx| async move { Ok(Trickle { chunks }) })
}

pub fn echo(name: &str) -> DeploymentSpec {
    DeploymentSpec::new(name, |_ctx| async { Ok(Echo) })
}

/// Counts loads and unloads across all replicas of a [`counted`] deployment.
#[derive(Default)]
pub struct Counters {
    pub loads: AtomicUsize,
    pub unloads: AtomicUsize,
}

pub struct Counted {
    counters: Arc<Counters>,
}

impl Model for Counted {
    async fn unload(self) -> Result<(), BoxError> {
        self.counters.unloads.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

/// A deployment with a model cache: loads take `load`, requests take `infer`.
pub struct Cached {
    models: Multiplexer<Counted>,
    replica: String,
    infer: Duration,
}

impl Deployment for Cached {
    async fn call(&self, _request: Request) -> Result<Response, BoxError> {
        let id = modelmux_context::multiplexed_model_id().ok_or("no model")?;
        // The slot is given back while the model loads, as `model_deployment` does.
        let _model = modelmux_serve::waiting_for_load(self.models.get(&id)).await?;
        if !self.infer.is_zero() {
            tokio::time::sleep(self.infer).await;
        }
        Ok(json_response(
            serde_json::json!({"model_id": id.as_str(), "replica": self.replica}),
        ))
    }
}

pub fn counted(
    name: &str,
    counters: Arc<Counters>,
    cache: MultiplexerBuilder,
    load: Duration,
    infer: Duration,
) -> DeploymentSpec {
    DeploymentSpec::new(name, move |ctx: ReplicaContext| {
        let (counters, cache) = (counters.clone(), cache.clone());
        async move {
            let models = ctx.multiplexer(cache, move |_id: ModelId| {
                let counters = counters.clone();
                async move {
                    tokio::time::sleep(load).await;
                    counters.loads.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Counted { counters })
                }
            });
            Ok(Cached {
                models,
                replica: ctx.replica_id().to_string(),
                infer,
            })
        }
    })
}

/// A server on a free loopback port serving `app` under `options`.
pub async fn start(
    app: modelmux_serve::Application,
    options: modelmux_front::HttpOptions,
) -> modelmux_front::Server {
    modelmux_front::Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .http_options(options)
        .application(app)
        .start()
        .await
        .unwrap()
}

/// A server on a free loopback port with one application whose ingress is `spec`.
pub async fn serve(spec: DeploymentSpec) -> modelmux_front::Server {
    modelmux_front::Server::builder()
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .application(modelmux_serve::Application::new("a").ingress(spec))
        .start()
        .await
        .unwrap()
}

/// Requests in flight on all the server's replicas, as its `/-/models` listing counts them,
/// and the listing.
pub async fn ongoing_requests(addr: SocketAddr) -> (u64, serde_json::Value) {
    let listing = get(addr, "/-/models", &[]).await.json();
    let ongoing = listing["applications"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|a| a["deployments"].as_array().into_iter().flatten())
        .flat_map(|d| d["replicas"].as_array().into_iter().flatten())
        .filter_map(|r| r["ongoing_requests"].as_u64())
        .sum();
    (ongoing, listing)
}
