//! What structured output and metrics scraping cost, over HTTP in one process;
//! `scripts/bench-structured` runs it.
//!
//! ```sh
//! cargo run --release -p modelmux-openai --example bench_structured -- --gguf MODEL.gguf \
//!     [--tokens 64] [--runs 5] [--scrape-ms 1000]
//! ```
//!
//! Prints JSON lines. Every stream completes the same prompt (as token ids) greedily with EOS
//! ignored, `--tokens` tokens each, through `POST /v1/completions` streamed.
//!
//! - `constrained_N` (N = 1, 8 streams): aggregate decode tok/s of the same requests free and
//!   under a JSON schema (an array of at least 100 free strings: the output never completes
//!   before `--tokens`, and almost every token stays allowed, so each mask walks most of the
//!   vocabulary: the expensive kind of mask); runs alternate, medians, and their ratio.
//! - `scrape8`: 8 free streams with and without a client scraping `/metrics` every
//!   `--scrape-ms` (runs alternate; medians of the generation's wall time and their ratio),
//!   and the time one scrape takes, as a share of the interval (the steadier estimate on a
//!   shared machine). The scrape must carry the `vllm:` series.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use modelmux_front::Server;
use modelmux_llm::{ChatMessage, LlmRuntime, RuntimeOptions};
use modelmux_openai::{LlmConfig, llm_deployments};
use modelmux_serve::Application;
use serde_json::{Value, json};
use tokio::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const QUESTION: &str = "List the names of twenty famous lighthouses, as JSON.";

struct Args {
    gguf: String,
    tokens: usize,
    runs: usize,
    scrape_ms: u64,
}

fn args() -> Args {
    let mut a = Args {
        gguf: String::new(),
        tokens: 64,
        runs: 5,
        scrape_ms: 1000,
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
            "--tokens" => a.tokens = number() as usize,
            "--runs" => a.runs = number() as usize,
            "--scrape-ms" => a.scrape_ms = number(),
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

async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Res<(u16, Vec<u8>)> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let bytes = body
        .map(serde_json::to_vec)
        .transpose()?
        .unwrap_or_default();
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    Ok((
        status,
        response.into_body().collect().await?.to_bytes().to_vec(),
    ))
}

/// One streamed completion: its completion tokens (from the usage chunk).
async fn complete(addr: SocketAddr, body: Value) -> Res<usize> {
    let (status, bytes) = send(addr, "POST", "/v1/completions", Some(&body)).await?;
    let text = String::from_utf8(bytes)?;
    if status != 200 {
        return Err(format!("status {status}: {text}").into());
    }
    let usage = text
        .split("\n\n")
        .filter_map(|e| serde_json::from_str::<Value>(e.trim().trim_start_matches("data: ")).ok())
        .find_map(|v| v["usage"]["completion_tokens"].as_u64())
        .ok_or("no usage chunk")?;
    Ok(usage as usize)
}

/// `streams` concurrent completions: aggregate tok/s and the wall time.
async fn batch(addr: SocketAddr, body: &Value, streams: usize) -> Res<(f64, Duration)> {
    let started = Instant::now();
    let tasks: Vec<_> = (0..streams)
        .map(|_| tokio::spawn(complete(addr, body.clone())))
        .collect();
    let mut tokens = 0;
    for t in tasks {
        tokens += t.await??;
    }
    let wall = started.elapsed();
    Ok((tokens as f64 / wall.as_secs_f64(), wall))
}

#[tokio::main]
async fn main() -> Res<()> {
    let a = args();
    let prompt = {
        let runtime = LlmRuntime::load(&a.gguf, None, RuntimeOptions::default()).await?;
        runtime.chat_prompt(&[ChatMessage::new("user", QUESTION)])?
    };
    let config: LlmConfig = serde_json::from_value(json!({
        "model_loading_config": {"model_id": "smollm2", "model_source": a.gguf},
        "engine_kwargs": {"max_num_seqs": 16},
        "experimental_configs": {"stream_batching_interval_ms": 50},
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
    let free = json!({"model": "smollm2", "prompt": prompt, "max_tokens": a.tokens,
        "temperature": 0, "ignore_eos": true, "stream": true,
        "stream_options": {"include_usage": true}});
    let mut constrained = free.clone();
    constrained["response_format"] = json!({"type": "json_schema", "json_schema": {
        "name": "lighthouses",
        "schema": {"type": "array", "items": {"type": "string"}, "minItems": 100}}});
    // Warm-up: the grammar compiler indexes the vocabulary on first use.
    batch(addr, &constrained, 1).await?;
    batch(addr, &free, 8).await?;

    for streams in [1usize, 8] {
        let (mut f, mut c) = (Vec::new(), Vec::new());
        for _ in 0..a.runs {
            f.push(batch(addr, &free, streams).await?.0);
            c.push(batch(addr, &constrained, streams).await?.0);
        }
        let (f, c) = (median(f), median(c));
        println!(
            "{}",
            json!({"scenario": format!("constrained_{streams}"), "free_tok_s": f,
                "constrained_tok_s": c, "ratio": c / f})
        );
    }

    let (status, body) = send(addr, "GET", "/metrics", None).await?;
    let text = String::from_utf8(body)?;
    if status != 200 || !text.contains("vllm:num_requests_running") {
        return Err(format!("/metrics ({status}) lacks the vllm: series").into());
    }
    let scrape_bytes = text.len();
    let mut scrape_times = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        send(addr, "GET", "/metrics", None).await?;
        scrape_times.push(started.elapsed().as_secs_f64() * 1e3);
    }
    let scrape_ms = median(scrape_times);
    let (mut plain, mut scraped) = (Vec::new(), Vec::new());
    for _ in 0..a.runs {
        plain.push(batch(addr, &free, 8).await?.1.as_secs_f64());
        let interval = Duration::from_millis(a.scrape_ms);
        let scraper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            loop {
                tick.tick().await;
                let _ = send(addr, "GET", "/metrics", None).await;
            }
        });
        scraped.push(batch(addr, &free, 8).await?.1.as_secs_f64());
        scraper.abort();
    }
    let (p, s) = (median(plain), median(scraped));
    println!(
        "{}",
        json!({"scenario": "scrape8", "scrape_every_ms": a.scrape_ms, "scrape_bytes": scrape_bytes,
            "scrape_ms": scrape_ms, "scrape_share": scrape_ms / a.scrape_ms as f64,
            "wall_s": p, "wall_scraped_s": s, "ratio": s / p})
    );
    server.shutdown().await;
    Ok(())
}
