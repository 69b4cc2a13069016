//! The prefix cache's worth: requests that share a long prefix (a system prompt, few-shot
//! examples) and differ in a short suffix, one after another, with prefix caching off and on,
//! in one run. Prints the median time to first token of each, the prompt tokens computed, the
//! tokens found in the cache, and the ratio of the TTFTs.
//!
//! ```sh
//! cargo run --release -p modelmux-llm --example bench_prefix -- --gguf MODEL.gguf \
//!     [--prefix 448] [--suffix 16] [--requests 16]
//! ```

use std::sync::Arc;

use modelmux_llm::{
    Engine, EngineConfig, GenerationEvent, GenerationRequest, GgufFile, LlamaModel, LlamaWeights,
    SamplingParams, TextTokenizer, WeightFormat,
};
use serde_json::json;
use tokio::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Time to the first token of a greedy one-token generation of `prompt`.
async fn ttft(engine: &Engine, prompt: Vec<u32>) -> Res<f64> {
    let started = Instant::now();
    let mut stream = engine.submit(GenerationRequest {
        prompt,
        params: SamplingParams::greedy(1),
        adapter: None,
        constraint: None,
    })?;
    let mut first = None;
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { .. } if first.is_none() => {
                first = Some(started.elapsed().as_secs_f64());
            }
            GenerationEvent::Error(e) => return Err(e.to_string().into()),
            _ => {}
        }
    }
    first.ok_or_else(|| "no token".into())
}

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let gguf = arg(&args, "--gguf").ok_or("--gguf MODEL.gguf is needed")?;
    let prefix_len: usize = arg(&args, "--prefix").map_or(Ok(448), |v| v.parse())?;
    let suffix_len: usize = arg(&args, "--suffix").map_or(Ok(16), |v| v.parse())?;
    let requests: usize = arg(&args, "--requests").map_or(Ok(16), |v| v.parse())?;
    let tokenizer = Arc::new(TextTokenizer::from_gguf(&GgufFile::open(&gguf)?)?);
    let weights = LlamaWeights::load(&gguf, WeightFormat::default())?;
    let model = Arc::new(LlamaModel::new(weights, 2048));
    let prefix: Vec<u32> = (0..prefix_len as u32)
        .map(|i| 200 + (i * 37) % 9000)
        .collect();
    let mut medians = Vec::new();
    for caching in [false, true] {
        let engine = Engine::start(
            model.clone(),
            tokenizer.clone(),
            EngineConfig {
                max_model_len: 2048,
                enable_prefix_caching: caching,
                ..EngineConfig::default()
            },
        )?;
        let mut times = Vec::new();
        for r in 0..requests {
            let mut prompt = prefix.clone();
            prompt.extend((0..suffix_len as u32).map(|i| 9300 + (r as u32 * 31 + i) % 500));
            let t = ttft(&engine, prompt).await?;
            // The first request of each run fills the cache (or warms up).
            if r > 0 {
                times.push(t);
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let s = engine.snapshot();
        println!(
            "{}",
            json!({
                "prefix_caching": caching,
                "requests": requests,
                "prompt_tokens_each": prefix_len + suffix_len,
                "ttft_median_ms": median * 1e3,
                "prompt_tokens_computed": s.prompt_tokens,
                "prefix_cache_hits": s.prefix_cache_hits,
                "prefix_cache_bytes": s.prefix_cache_bytes,
            })
        );
        medians.push(median);
    }
    println!(
        "{}",
        json!({"ttft_with_cache_over_without": medians[1] / medians[0]})
    );
    Ok(())
}
