//! The OpenAI API over HTTP against the engine called directly, in one process;
//! `scripts/bench-llm` runs it beside llama.cpp's server.
//!
//! ```sh
//! cargo run --release -p modelmux-openai --example bench_http -- --gguf MODEL.gguf \
//!     --adapters DIR [--tokens 64] [--runs 2] [--interval-ms 50]
//! ```
//!
//! Prints JSON lines. Every stream completes the same chat prompt (as token ids) greedily with
//! EOS ignored, so each generates exactly `--tokens` tokens; adapters are `DIR/bench-00`, ...
//!
//! - `engine8`: 8 concurrent sequences on 8 adapters through `LlmRuntime::generate` (no HTTP):
//!   aggregate tok/s, median of `--runs` (at least 2).
//! - `http8`: the same 8 streams as `POST /v1/completions` with `stream: true` through a
//!   server in this process (ingress, handle, router, one LLM replica): aggregate tok/s, and
//!   its ratio to `engine8`: runs of the two alternate (each going first in turn), and the
//!   ratio is the median of each pair's, so the machine's drift falls on both.
//! - `ttft_http_N` for N = 1, 8, 32 concurrent streams (adapters cycling over 16, all loaded
//!   beforehand): p50 and p99 time from sending the request to the first streamed text; and
//!   `prefill_floor_ms`, the time the engine (called directly, with the server's settings and
//!   its prefix cache as warm) takes to give the first token of the same N prompts on the same
//!   adapters submitted at once: the floor when they arrive together. Each HTTP run is paired
//!   with a floor run right after it; the floor is the median of those runs.
//! - `replicas`: 8 streams on the base model over HTTP with 1 LLM replica and with 2 (the
//!   demo's configuration), and 8 streams on 8 adapters with 2, both servers up at once and
//!   measured in 2 x `--runs` (at least 10) rounds, each in the reverse order of the one
//!   before: aggregate tok/s, and 2 replicas against 1 and adapters against the base model on
//!   2 as medians of the rounds' own ratios.
//! - `demo` (with `--demo-config examples/llm.yaml`): the demo's own settings (its replicas,
//!   adapter slots, engine sizes and stream interval; the model and adapters are the bench's),
//!   8 streams on adapters mixed over as many of them as a replica holds, against 8 streams on
//!   the base model, on one server, in alternating rounds: `mixed_vs_base`, the median of the
//!   rounds' ratios.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use modelmux_front::Server;
use modelmux_llm::{ChatMessage, LlmRuntime, RuntimeOptions, SamplingParams};
use modelmux_openai::{LlmConfig, llm_deployments};
use modelmux_serve::Application;
use modelmux_store::{ModelRepository, RepositoryOptions};
use serde_json::json;
use tokio::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const QUESTION: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.";

struct Args {
    gguf: String,
    adapters: String,
    tokens: usize,
    runs: usize,
    interval_ms: u64,
    demo_config: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        gguf: String::new(),
        adapters: String::new(),
        tokens: 64,
        runs: 2,
        interval_ms: 50,
        demo_config: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_else(|| panic!("{flag} needs a value"));
        match flag.as_str() {
            "--gguf" => a.gguf = value,
            "--adapters" => a.adapters = value,
            "--tokens" => a.tokens = value.parse().expect("--tokens: a number"),
            "--runs" => a.runs = value.parse().expect("--runs: a number"),
            "--interval-ms" => a.interval_ms = value.parse().expect("--interval-ms: a number"),
            "--demo-config" => a.demo_config = Some(value),
            other => panic!("unknown flag {other}"),
        }
    }
    assert!(
        !a.gguf.is_empty() && !a.adapters.is_empty(),
        "--gguf and --adapters are required"
    );
    a
}

fn pct(mut v: Vec<f64>, p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(((p * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1)
        .copied()
        .unwrap_or(0.0)
}

fn options(max_seqs: usize) -> RuntimeOptions {
    let mut o = RuntimeOptions {
        max_adapters: 16,
        ..RuntimeOptions::default()
    };
    o.engine.max_num_seqs = max_seqs;
    o.engine.max_batch_tokens = 256.max(max_seqs);
    o
}

/// 8 sequences on 8 adapters through the runtime, no HTTP.
struct Direct {
    runtime: LlmRuntime,
    params: SamplingParams,
}

impl Direct {
    async fn load(a: &Args, options: RuntimeOptions) -> Res<Self> {
        let repo = ModelRepository::open(&a.adapters, RepositoryOptions::default())?;
        Ok(Self {
            runtime: LlmRuntime::load(&a.gguf, Some(repo), options).await?,
            params: SamplingParams {
                ignore_eos: true,
                ..SamplingParams::greedy(a.tokens)
            },
        })
    }

    /// One run: aggregate tok/s.
    async fn rate(&self, prompt: &[u32]) -> Res<f64> {
        let started = Instant::now();
        let mut streams = Vec::new();
        for i in 0..8 {
            let lease = self.runtime.adapter(&format!("bench-{i:02}")).await?;
            let params = self.params.clone();
            streams.push(
                self.runtime
                    .generate(prompt.to_vec(), params, Some(lease))?,
            );
        }
        let mut tokens = 0;
        for s in streams {
            tokens += s
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .usage
                .completion_tokens;
        }
        Ok(tokens as f64 / started.elapsed().as_secs_f64())
    }

    /// The prompt on each of `adapters` at once, one token each: the time until the last
    /// first token, in ms.
    async fn first_tokens(&self, adapters: &[String], prompt: &[u32]) -> Res<f64> {
        let mut leases = Vec::new();
        for name in adapters {
            leases.push(self.runtime.adapter(name).await?);
        }
        let params = SamplingParams {
            ignore_eos: true,
            ..SamplingParams::greedy(1)
        };
        let started = Instant::now();
        let streams = leases
            .into_iter()
            .map(|lease| {
                self.runtime
                    .generate(prompt.to_vec(), params.clone(), Some(lease))
            })
            .collect::<Result<Vec<_>, _>>()?;
        for s in streams {
            s.collect().await.map_err(|e| e.to_string())?;
        }
        Ok(started.elapsed().as_secs_f64() * 1e3)
    }
}

/// One streamed completion over HTTP: (time to first text, completion tokens).
async fn stream(addr: SocketAddr, body: &serde_json::Value) -> Res<(Duration, usize)> {
    let started = Instant::now();
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
    tokio::spawn(conn);
    let request = hyper::Request::post("/v1/completions")
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(serde_json::to_vec(body)?)))?;
    let mut response = sender.send_request(request).await?;
    if response.status() != 200 {
        let body = response.into_body().collect().await?.to_bytes();
        return Err(format!("status: {}", String::from_utf8_lossy(&body)).into());
    }
    let (mut first, mut tokens, mut buffer) = (None, 0, String::new());
    while let Some(frame) = response.body_mut().frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        buffer.push_str(std::str::from_utf8(&data)?);
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let payload = event.trim().trim_start_matches("data: ");
            if payload == "[DONE]" {
                let first = first.ok_or("no text was streamed")?;
                return Ok((first, tokens));
            }
            let v: serde_json::Value = serde_json::from_str(payload)?;
            if first.is_none()
                && v["choices"][0]["text"]
                    .as_str()
                    .is_some_and(|t| !t.is_empty())
            {
                first = Some(started.elapsed());
            }
            if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
                tokens = n as usize;
            }
        }
    }
    Err("the stream ended without [DONE]".into())
}

/// `models.len()` concurrent streams: their results and the wall time.
async fn batch(
    addr: SocketAddr,
    models: &[String],
    prompt: &[u32],
    tokens: usize,
) -> Res<(Vec<(Duration, usize)>, Duration)> {
    let started = Instant::now();
    let tasks: Vec<_> = models
        .iter()
        .map(|m| {
            let body = json!({"model": m, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
                "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});
            tokio::spawn(async move { stream(addr, &body).await })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await??);
    }
    Ok((out, started.elapsed()))
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
        "lora_config": {"dynamic_lora_loading_path": a.adapters, "max_num_adapters_per_replica": 16},
        "engine_kwargs": {"max_num_seqs": 32},
        "experimental_configs": {"stream_batching_interval_ms": a.interval_ms},
    }))?;
    let (server, addr) = serve(&config, 1).await?;
    let adapters: Vec<String> = (0..16).map(|i| format!("smollm2:bench-{i:02}")).collect();
    batch(addr, &adapters, &prompt, 2).await?; // warm-up: every adapter loaded
    // The engine called directly and over HTTP, runs alternating (which goes first too), so
    // the machine's drift falls on both; the ratio is the median of each pair's.
    let direct = Direct::load(&a, options(16)).await?;
    direct.rate(&prompt).await?; // warm-up
    let (mut engine, mut http, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..a.runs.max(2) {
        let (e, h) = if run % 2 == 0 {
            let e = direct.rate(&prompt).await?;
            (e, rate_once(addr, &adapters[..8], &prompt, a.tokens).await?)
        } else {
            let h = rate_once(addr, &adapters[..8], &prompt, a.tokens).await?;
            (direct.rate(&prompt).await?, h)
        };
        engine.push(e);
        http.push(h);
        ratios.push(h / e);
    }
    drop(direct);
    // The floor for TTFT: the engine with the server's settings, its prefix cache warmed as
    // the server's was (every adapter once with the prompt).
    let floor = Direct::load(&a, config.runtime_options()).await?;
    let engine_ids: Vec<String> = (0..16).map(|i| format!("bench-{i:02}")).collect();
    floor.first_tokens(&engine_ids, &prompt).await?;
    println!(
        "{}",
        json!({"scenario": "engine8", "aggregate_tok_s": pct(engine, 0.5)})
    );
    println!(
        "{}",
        json!({"scenario": "http8", "aggregate_tok_s": pct(http, 0.5), "vs_engine8": pct(ratios, 0.5)})
    );
    for n in [1usize, 8, 32] {
        let (mut ttfts, mut floors) = (Vec::new(), Vec::new());
        for run in 0..a.runs.max(2) {
            let models: Vec<String> = (0..n).map(|i| adapters[(i + run) % 16].clone()).collect();
            let (out, _) = batch(addr, &models, &prompt, a.tokens.min(32)).await?;
            ttfts.extend(out.iter().map(|o| o.0.as_secs_f64() * 1e3));
            let ids: Vec<String> = (0..n).map(|i| engine_ids[(i + run) % 16].clone()).collect();
            floors.push(floor.first_tokens(&ids, &prompt).await?);
        }
        println!(
            "{}",
            json!({"scenario": format!("ttft_http_{n}"), "ttft_p50_ms": pct(ttfts.clone(), 0.5),
                "ttft_p99_ms": pct(ttfts, 0.99), "prefill_floor_ms": pct(floors, 0.5)})
        );
    }
    drop(floor);
    server.shutdown().await;

    // Both servers up at once (an idle one costs nothing), measured in alternating rounds and
    // compared round by round: this machine's speed drifts by tens of percent between minutes,
    // which one server measured after the other read as a difference between them.
    let (one, one_addr) = serve(&config, 1).await?;
    let (two, two_addr) = serve(&config, 2).await?;
    for addr in [one_addr, two_addr] {
        batch(addr, &adapters[..8], &prompt, 2).await?; // warm-up: the adapters loaded
    }
    let base_models = vec!["smollm2".to_owned(); 8];
    let (mut base1, mut base2, mut adapters2) = (Vec::new(), Vec::new(), Vec::new());
    let (mut two_vs_one, mut adapters_vs_base) = (Vec::new(), Vec::new());
    // The order turns round each round (1, 2, adapters; then adapters, 2, 1), so that a drift
    // within a round falls on both sides of each ratio alike.
    for round in 0..(2 * a.runs).max(10) {
        let mut order = [0, 1, 2];
        if round % 2 == 1 {
            order.reverse();
        }
        let mut rates = [0.0; 3];
        for i in order {
            let (addr, models) = match i {
                0 => (one_addr, &base_models[..]),
                1 => (two_addr, &base_models[..]),
                _ => (two_addr, &adapters[..8]),
            };
            rates[i] = rate_once(addr, models, &prompt, a.tokens).await?;
        }
        let [b1, b2, a2] = rates;
        two_vs_one.push(b2 / b1);
        adapters_vs_base.push(a2 / b2);
        base1.push(b1);
        base2.push(b2);
        adapters2.push(a2);
    }
    one.shutdown().await;
    two.shutdown().await;
    if let Some(path) = &a.demo_config {
        demo(&a, path, &prompt).await?;
    }
    println!(
        "{}",
        json!({"scenario": "replicas", "base8_1_tok_s": pct(base1, 0.5),
            "base8_2_tok_s": pct(base2, 0.5), "adapters8_2_tok_s": pct(adapters2, 0.5),
            "two_vs_one": pct(two_vs_one.clone(), 0.5), "two_vs_one_rounds": two_vs_one,
            "adapters_vs_base_2": pct(adapters_vs_base.clone(), 0.5),
            "adapters_vs_base_2_rounds": adapters_vs_base})
    );
    Ok(())
}

/// The demo's configuration (`path`, `examples/llm.yaml`) with the bench's model and adapters:
/// mixed adapter traffic against the base model's, in alternating rounds on one server.
async fn demo(a: &Args, path: &str, prompt: &[u32]) -> Res<()> {
    let yaml: serde_json::Value = serde_yaml_ng::from_str(&std::fs::read_to_string(path)?)?;
    let deployment = &yaml["applications"][0]["deployments"][0];
    let mut model = deployment["model"].clone();
    let settings = model
        .as_object_mut()
        .ok_or("the demo's first deployment has no model")?;
    settings.remove("kind");
    settings["model_loading_config"]["model_source"] = json!(a.gguf);
    settings["lora_config"]["dynamic_lora_loading_path"] = json!(a.adapters);
    let slots = settings["lora_config"]["max_num_adapters_per_replica"]
        .as_u64()
        .unwrap_or(8) as usize;
    let replicas = deployment["num_replicas"].as_u64().unwrap_or(1) as usize;
    let config: LlmConfig = serde_json::from_value(model)?;
    let (server, addr) = serve(&config, replicas).await?;
    let mixed: Vec<String> = (0..8)
        .map(|i| format!("smollm2:bench-{:02}", i % slots.clamp(1, 8)))
        .collect();
    let base = vec!["smollm2".to_owned(); 8];
    batch(addr, &mixed, prompt, 2).await?; // warm-up: the adapters loaded
    let (mut mixed_rates, mut base_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..(2 * a.runs).max(10) {
        let (m, b) = if round % 2 == 0 {
            let m = rate_once(addr, &mixed, prompt, a.tokens).await?;
            (m, rate_once(addr, &base, prompt, a.tokens).await?)
        } else {
            let b = rate_once(addr, &base, prompt, a.tokens).await?;
            (rate_once(addr, &mixed, prompt, a.tokens).await?, b)
        };
        mixed_rates.push(m);
        base_rates.push(b);
        ratios.push(m / b);
    }
    server.shutdown().await;
    println!(
        "{}",
        json!({"scenario": "demo", "replicas": replicas, "adapter_slots": slots,
            "mixed8_tok_s": pct(mixed_rates, 0.5), "base8_tok_s": pct(base_rates, 0.5),
            "mixed_vs_base": pct(ratios.clone(), 0.5), "mixed_vs_base_rounds": ratios})
    );
    Ok(())
}

/// A server in this process with the LLM deployment on `replicas` replicas.
async fn serve(config: &LlmConfig, replicas: usize) -> Res<(Server, SocketAddr)> {
    let both = llm_deployments("llm", config, "/", None, &Default::default())?;
    let server = Server::builder()
        .bind("127.0.0.1:0".parse()?)
        .application(
            Application::new("llm")
                .ingress(both.ingress)
                .deployment(both.server.num_replicas(replicas)),
        )
        .start()
        .await?;
    let addr = server.local_addr();
    Ok((server, addr))
}

/// Aggregate tok/s of one batch of concurrent streams on `models`.
async fn rate_once(addr: SocketAddr, models: &[String], prompt: &[u32], tokens: usize) -> Res<f64> {
    let (out, wall) = batch(addr, models, prompt, tokens).await?;
    Ok(out.iter().map(|o| o.1).sum::<usize>() as f64 / wall.as_secs_f64())
}
