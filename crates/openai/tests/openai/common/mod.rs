//! What the OpenAI API tests share: SmolLM2 served in process (an ingress and LLM replicas, as
//! `modelmux serve` builds them), a small HTTP client, and the engine's own answers to
//! compare with.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use modelmux_front::Server;
use modelmux_llm::{ChatMessage, LlmRuntime, RuntimeOptions, SamplingParams};
use modelmux_openai::{LlmConfig, llm_deployments};
use modelmux_serve::Application;
use modelmux_store::{ModelRepository, RepositoryOptions};
use tokio::net::TcpStream;

/// A variable the test command sets; its absence fails the test.
pub fn env_path(name: &str) -> PathBuf {
    let value = std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with ./scripts/test, which fetches the model and writes the adapters")
    });
    PathBuf::from(value)
}

/// The `kind: llm` settings of the tests, with `extra` merged over them (JSON).
pub fn config(extra: serde_json::Value) -> LlmConfig {
    let mut base = serde_json::json!({
        "model_loading_config": {
            "model_id": "smollm2",
            "model_source": env_path("MODELMUX_TEST_GGUF"),
        },
        "lora_config": {
            "dynamic_lora_loading_path": env_path("MODELMUX_TEST_ADAPTERS"),
            "max_num_adapters_per_replica": 8,
        },
        "engine_kwargs": {"max_num_seqs": 16, "max_model_len": 1024, "kv_cache_bytes": 256u64 << 20},
        "experimental_configs": {"stream_batching_interval_ms": 0},
    });
    merge(&mut base, extra);
    serde_json::from_value(base).unwrap()
}

fn merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

/// A server on a free port serving `config` with `replicas` LLM replicas.
pub async fn serve(config: &LlmConfig, replicas: usize) -> Server {
    let both = llm_deployments("llm", config, "/", None, &Default::default()).unwrap();
    Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .application(
            Application::new("llm")
                .ingress(both.ingress)
                .deployment(both.server.num_replicas(replicas)),
        )
        .start()
        .await
        .unwrap()
}

pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    /// The `data:` payloads of a Server-Sent Events body.
    pub fn events(&self) -> Vec<String> {
        let text = std::str::from_utf8(&self.body).unwrap();
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not an SSE data event: {e:?}"))
                    .to_owned()
            })
            .collect()
    }
}

/// Sends one request on a fresh connection and reads the whole answer.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = sender
        .send_request(request.body(Full::new(Bytes::from(body))).unwrap())
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

pub async fn post(addr: SocketAddr, path: &str, body: serde_json::Value) -> Reply {
    send(addr, "POST", path, &[], serde_json::to_vec(&body).unwrap()).await
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, &[], Vec::new()).await
}

/// A chat request for greedy decoding.
pub fn chat(model: &str, content: &str, max_tokens: usize, stream: bool) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    })
}

/// The text of a streamed chat answer, and its finish reason.
pub fn streamed_text(reply: &Reply) -> (String, String) {
    let events = reply.events();
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    let mut text = String::new();
    let mut reason = String::new();
    for e in &events[..events.len() - 1] {
        let v: serde_json::Value = serde_json::from_str(e).unwrap();
        assert!(v.get("error").is_none(), "{e}");
        if let Some(choice) = v["choices"].get(0) {
            if let Some(t) = choice["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if let Some(t) = choice["text"].as_str() {
                text.push_str(t);
            }
            if let Some(r) = choice["finish_reason"].as_str() {
                reason = r.to_owned();
            }
        }
    }
    (text, reason)
}

/// The engine's own greedy answer to one user message, with `adapter` or none: what the HTTP
/// path must reproduce.
pub async fn direct(content: &str, adapter: Option<&str>, max_tokens: usize) -> String {
    let repository = ModelRepository::open(
        env_path("MODELMUX_TEST_ADAPTERS").to_str().unwrap(),
        RepositoryOptions::default(),
    )
    .unwrap();
    let runtime = LlmRuntime::load(
        env_path("MODELMUX_TEST_GGUF"),
        Some(repository),
        RuntimeOptions::default(),
    )
    .await
    .unwrap();
    let prompt = runtime
        .chat_prompt(&[ChatMessage::new("user", content)])
        .unwrap();
    let lease = match adapter {
        Some(a) => Some(runtime.adapter(a).await.unwrap()),
        None => None,
    };
    runtime
        .generate(prompt, SamplingParams::greedy(max_tokens), lease)
        .unwrap()
        .collect()
        .await
        .unwrap()
        .text
}

/// The whole `/metrics` page.
pub async fn metrics(addr: SocketAddr) -> String {
    String::from_utf8(get(addr, "/metrics").await.body.to_vec()).unwrap()
}

/// POSTs to the admin API's control `name` of the LLM deployment (every replica).
pub async fn control(addr: SocketAddr, name: &str) -> Reply {
    let path = format!("/-/deployments/llm/controls/{name}");
    send(addr, "POST", &path, &[], Vec::new()).await
}

/// The sum of a metric's samples in Prometheus text.
pub fn metric(text: &str, name: &str) -> f64 {
    page(text).sum(name)
}

/// A `/metrics` page, parsed (a malformed page fails the test).
pub fn page(text: &str) -> modelmux_promtext::Page {
    modelmux_promtext::parse(text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
}
