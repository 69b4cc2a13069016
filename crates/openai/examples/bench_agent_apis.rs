//! What the Responses and Messages APIs cost over the chat they translate into, over HTTP in
//! one process; `scripts/bench-agent-apis` runs it.
//!
//! ```sh
//! cargo run --release -p modelmux-openai --example bench_agent_apis -- --gguf MODEL.gguf \
//!     [--tokens 64] [--runs 5] [--chains 40]
//! ```
//!
//! Prints JSON lines.
//!
//! - `streams8`: 8 concurrent streamed requests of the same conversation through
//!   `/v1/chat/completions`, `/v1/responses` and `/v1/messages` (greedy, `--tokens` at most; the
//!   three generate the same tokens), runs alternating between the APIs; the median aggregate
//!   tok/s of each (output tokens as each API's own usage reports them), and each API's ratio
//!   to the chat's: the median of the runs' paired ratios (each to the chat of its own run),
//!   with the distribution-free ~95% interval of that median.
//! - `chain`: a turn sent with `previous_response_id` (the conversation read from the store)
//!   against the same turn with the whole conversation in `input`, alternating, `--chains`
//!   each, one output token, both stored (a redb file on disk, as a node keeps it); the p50
//!   latency of each and their difference, and the p50 of a `GET /v1/responses/{id}` (a read
//!   of the store alone, through HTTP).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use modelmux_front::Server;
use modelmux_openai::{LlmConfig, llm_deployments};
use modelmux_serve::Application;
use serde_json::{Value, json};
use tokio::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const QUESTION: &str = "Tell me about the history of Rome.";
const APIS: [&str; 3] = ["chat", "responses", "messages"];

struct Args {
    gguf: String,
    tokens: u64,
    runs: usize,
    chains: usize,
}

fn args() -> Args {
    let mut a = Args {
        gguf: String::new(),
        tokens: 64,
        runs: 5,
        chains: 40,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        let number = || {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{flag}: a number"))
        };
        match flag.as_str() {
            "--gguf" => a.gguf = value,
            "--tokens" => a.tokens = number(),
            "--runs" => a.runs = number() as usize,
            "--chains" => a.chains = number() as usize,
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(!a.gguf.is_empty(), "--gguf is required");
    a
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The order statistics that bound the median of `v` with at least 95% confidence whatever
/// the distribution (the binomial rule: ranks k and n + 1 - k with P(Bin(n, 1/2) < k) <=
/// 2.5%); the extremes where `v` is too short for that.
fn median_interval(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let below = |k: usize| -> f64 {
        // P(Bin(n, 1/2) < k), summed exactly.
        let mut c = 1.0;
        let mut sum = 0.0;
        for i in 0..k {
            sum += c;
            c = c * (n - i) as f64 / (i + 1) as f64;
        }
        sum / 2f64.powi(n as i32)
    };
    let k = (1..=n / 2).rev().find(|&k| below(k) <= 0.025).unwrap_or(1);
    (v[k - 1], v[n - k])
}

async fn send(addr: SocketAddr, method: &str, path: &str, body: &Value) -> Res<(u16, String)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let bytes = if body.is_null() {
        Vec::new()
    } else {
        serde_json::to_vec(body)?
    };
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8(body.to_vec())?))
}

/// The streamed request of `api` for the benchmark's conversation, and where its answer is.
fn streamed(api: &str, tokens: u64) -> (&'static str, Value) {
    let messages = json!([{"role": "user", "content": QUESTION}]);
    match api {
        "chat" => (
            "/v1/chat/completions",
            json!({"model": "smollm2", "messages": messages, "max_tokens": tokens,
                "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}),
        ),
        "responses" => (
            "/v1/responses",
            json!({"model": "smollm2", "input": QUESTION, "max_output_tokens": tokens,
                "temperature": 0, "stream": true, "store": false}),
        ),
        _ => (
            "/v1/messages",
            json!({"model": "smollm2", "messages": messages, "max_tokens": tokens,
                "temperature": 0, "stream": true}),
        ),
    }
}

/// The output tokens a streamed answer reports (the last count any of its events carries).
fn output_tokens(events: &str) -> Option<u64> {
    events
        .lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| {
            v["usage"]["completion_tokens"]
                .as_u64()
                .or_else(|| v["response"]["usage"]["output_tokens"].as_u64())
                .or_else(|| v["usage"]["output_tokens"].as_u64())
        })
}

/// 8 concurrent streams of `api`: aggregate output tok/s.
async fn streams8(addr: SocketAddr, api: &'static str, tokens: u64) -> Res<f64> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(async move {
                let (path, body) = streamed(api, tokens);
                let (status, events) = send(addr, "POST", path, &body).await?;
                if status != 200 {
                    return Err(format!("{api}: {status} {events}").into());
                }
                let counted = output_tokens(&events);
                Res::Ok(counted.ok_or_else(|| format!("{api}: no usage in {events}"))?)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64())
}

/// A non-streamed `POST /v1/responses`: the answer, and how long it took in milliseconds.
async fn respond(addr: SocketAddr, body: &Value) -> Res<(Value, f64)> {
    let started = Instant::now();
    let (status, text) = send(addr, "POST", "/v1/responses", body).await?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    if status != 200 {
        return Err(format!("responses: {status} {text}").into());
    }
    Ok((serde_json::from_str(&text)?, ms))
}

async fn chain(addr: SocketAddr, chains: usize) -> Res<Value> {
    let first = json!({"model": "smollm2", "input": "My name is Ada and I live in Lisbon.",
        "max_output_tokens": 16, "temperature": 0});
    let (stored, _) = respond(addr, &first).await?;
    let id = stored["id"].as_str().ok_or("no id")?.to_owned();
    let said = stored["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let question = "Repeat my name and my city.";
    let chained = json!({"model": "smollm2", "previous_response_id": id, "input": question,
        "max_output_tokens": 1, "temperature": 0});
    let whole = json!({"model": "smollm2", "input": [
            {"role": "user", "content": "My name is Ada and I live in Lisbon."},
            {"role": "assistant", "content": said},
            {"role": "user", "content": question}],
        "max_output_tokens": 1, "temperature": 0});
    // The same prompt either way (the prefix cache serves both alike).
    let (a, _) = respond(addr, &chained).await?;
    let (b, _) = respond(addr, &whole).await?;
    if a["usage"]["input_tokens"] != b["usage"]["input_tokens"] {
        return Err(format!("the two turns differ: {} and {}", a["usage"], b["usage"]).into());
    }
    let (mut with_id, mut inline, mut read) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..chains {
        with_id.push(respond(addr, &chained).await?.1);
        inline.push(respond(addr, &whole).await?.1);
        let started = Instant::now();
        let (status, _) = send(addr, "GET", &format!("/v1/responses/{id}"), &Value::Null).await?;
        read.push(started.elapsed().as_secs_f64() * 1e3);
        if status != 200 {
            return Err(format!("GET the stored response: {status}").into());
        }
    }
    let (c, w) = (median(with_id), median(inline));
    Ok(
        json!({"scenario": "chain", "chains": chains, "chained_p50_ms": c, "inline_p50_ms": w,
        "added_p50_ms": c - w, "read_p50_ms": median(read)}),
    )
}

#[tokio::main]
async fn main() -> Res<()> {
    let a = args();
    let dir = tempfile::tempdir()?;
    let config: LlmConfig = serde_json::from_value(json!({
        "model_loading_config": {"model_id": "smollm2", "model_source": a.gguf},
        "engine_kwargs": {"max_num_seqs": 16},
        "experimental_configs": {"stream_batching_interval_ms": 20},
        "responses_store": {"path": dir.path().join("responses.redb")},
    }))?;
    let both = llm_deployments("llm", &config, "/", None, &Default::default())?;
    let server = Server::builder()
        .bind("127.0.0.1:0".parse()?)
        .application(
            Application::new("llm")
                .ingress(both.ingress)
                .deployment(both.server),
        )
        .start()
        .await?;
    let addr = server.local_addr();
    for api in APIS {
        streams8(addr, api, a.tokens).await?;
    }
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); APIS.len()];
    for run in 0..a.runs {
        // Each run starts with another API, so none always runs first.
        for k in 0..APIS.len() {
            let i = (run + k) % APIS.len();
            rates[i].push(streams8(addr, APIS[i], a.tokens).await?);
        }
    }
    // Each run's ratio to the chat of the same run (seconds apart, so the machine's drift
    // cancels), their median, and the distribution-free ~95% interval of that median.
    let paired = |api: usize| {
        let ratios: Vec<f64> = rates[api]
            .iter()
            .zip(&rates[0])
            .map(|(x, c)| x / c)
            .collect();
        let (low, high) = median_interval(ratios.clone());
        (median(ratios), low, high)
    };
    let (responses, messages) = (paired(1), paired(2));
    let medians: Vec<f64> = rates.into_iter().map(median).collect();
    println!(
        "{}",
        json!({"scenario": "streams8", "tokens": a.tokens, "runs": a.runs,
            "chat_tok_s": medians[0], "responses_tok_s": medians[1], "messages_tok_s": medians[2],
            "responses_ratio": responses.0, "responses_ratio_ci": [responses.1, responses.2],
            "messages_ratio": messages.0, "messages_ratio_ci": [messages.1, messages.2]})
    );
    println!("{}", chain(addr, a.chains).await?);
    tokio::time::timeout(Duration::from_secs(30), server.shutdown()).await?;
    Ok(())
}
