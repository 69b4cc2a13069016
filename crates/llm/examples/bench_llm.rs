//! In-process benchmark of the LLM engine; `scripts/bench-llm` runs it beside llama.cpp.
//!
//! ```sh
//! cargo run --release -p modelmux-llm --example bench_llm -- --gguf MODEL.gguf \
//!     --adapters DIR --scenario NAME [--tokens 64] [--streams 8] [--runs 3] \
//!     [--weights auto|q8_0|as-stored|f32] [--adapter-dtype f16|int8|f32]
//! ```
//!
//! Prints one JSON line per scenario. Every stream decodes the same fixed chat prompt
//! greedily with EOS ignored, so each generates exactly `--tokens` tokens. TTFT runs from the
//! request's start (its adapter lookup included) to its first token. Each scenario first runs
//! a short warm-up. Adapters are `DIR/bench-00`, `DIR/bench-01`, ... (`make_adapters.py
//! --bench N`).
//!
//! - `prompt`: the prompt's token ids (for llama.cpp), the weight bytes, KV bytes/token and
//!   the matrix kernel that runs (`MODELMUX_KERNEL` caps it: `avx2` runs the AVX2 kernel on an
//!   AVX-512 CPU).
//! - `single`: one stream on the base model: decode tok/s (tokens after the first over the
//!   time after the first), TTFT; medians of `--runs`. Its other figures are `base8`'s.
//! - `base8`: `--streams` concurrent streams on the base model: aggregate tok/s (all tokens
//!   over the time from the first submission to the last finish, the prompts' prefill
//!   included; median of `--runs`), their decode throughput together (`decode_all_tok_s`:
//!   the tokens that arrived while every stream was decoding, from the last stream's first
//!   token to the first stream's end, over that time; median of `--runs`), median and max
//!   TTFT over every stream, and the mean time of one engine step.
//! - `adapters8`: the same with stream i on adapter `bench-0i`, all loaded beforehand
//!   (`max_adapters` = streams). Each run is paired with a run of the same streams on the base
//!   model in the same runtime (before it in even runs, after it in odd ones):
//!   `vs_base_paired` is the median over runs of the adapters' aggregate tok/s over its base
//!   run's (`paired_base_aggregate_tok_s`, their median).
//! - `cycle16`: rounds of `--streams` concurrent requests, round k on adapters
//!   `(s*k .. s*k+s-1) mod 2s`; first through `s` cache slots (the other half loaded
//!   beforehand, so every round evicts and loads `s` adapters), then through `2s` slots with
//!   all of them loaded beforehand: median and p90 TTFT of each, and their ratio.
//! - `adapter_load`: a cold `runtime.adapter("bench-00")` (evicted between tries) against
//!   `std::fs::read` of its two files, and the parse alone (`LoraAdapter::from_peft`); medians.
//! - `memory`: VmRSS/VmHWM after loading the model, after loading `--streams` adapters, and
//!   after that many concurrent adapter sequences of 1024 tokens each (prompt + `--tokens`),
//!   against weight + adapter + KV bytes (prompt + output tokens x `kv_bytes_per_token`, what
//!   the engine reserves) + the bytes the prefix cache keeps of the prompts afterwards.
//! - `forward`: where a step's time goes, `LlamaModel::forward` alone (no engine): the
//!   prompt's prefill, a 256-token prefill, and decode steps of 1 row, `--streams` rows, and
//!   `--streams` rows on as many adapters (these two alternating, so both attend over the
//!   same lengths of context); medians.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use modelmux_llm::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterPrecision, ChatMessage, EngineConfig,
    GenerationEvent, KvCache, LlamaModel, LlamaWeights, LlmRuntime, LoraAdapter, RuntimeOptions,
    SamplingParams, Segment, WeightFormat,
};
use modelmux_store::{ModelRepository, RepositoryOptions};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// The user message of every stream's chat prompt (~40 tokens with SmolLM2's template).
const QUESTION: &str =
    "Write a short story about a lighthouse keeper who finds a message in a bottle.";
/// Tokens of the long prefill in the `forward` scenario.
const PREFILL_TOKENS: usize = 256;
/// Tokens per sequence (prompt + output) in the `memory` scenario.
const MEMORY_SEQ_TOKENS: usize = 1024;

struct Args {
    gguf: String,
    adapters: Option<String>,
    scenario: String,
    tokens: usize,
    streams: usize,
    runs: usize,
    weights: WeightFormat,
    adapter_precision: Option<AdapterPrecision>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        gguf: String::new(),
        adapters: None,
        scenario: String::new(),
        tokens: 64,
        streams: 8,
        runs: 3,
        weights: WeightFormat::Auto,
        adapter_precision: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{flag} wants a positive number, got {value:?}"))
        };
        match flag.as_str() {
            "--gguf" => a.gguf = value,
            "--adapters" => a.adapters = Some(value),
            "--scenario" => a.scenario = value,
            "--tokens" => a.tokens = number()?.max(2),
            "--streams" => a.streams = number()?,
            "--runs" => a.runs = number()?,
            "--weights" => {
                a.weights = match value.as_str() {
                    "auto" => WeightFormat::Auto,
                    "q8_0" => WeightFormat::Q8_0,
                    "as-stored" => WeightFormat::AsStored,
                    "f32" => WeightFormat::F32,
                    _ => return Err(format!("unknown --weights {value}")),
                }
            }
            "--adapter-dtype" => {
                a.adapter_precision = Some(match value.as_str() {
                    "f16" => AdapterPrecision::Half,
                    "int8" => AdapterPrecision::Int8,
                    "f32" => AdapterPrecision::Exact,
                    _ => return Err(format!("unknown --adapter-dtype {value}")),
                })
            }
            _ => return Err(format!("unknown argument {flag}")),
        }
    }
    if a.gguf.is_empty() || a.scenario.is_empty() {
        return Err("--gguf and --scenario are required".into());
    }
    Ok(a)
}

async fn load(args: &Args, max_adapters: usize) -> Res<Arc<LlmRuntime>> {
    let repository = match &args.adapters {
        Some(dir) => Some(ModelRepository::open(dir, RepositoryOptions::default())?),
        None => None,
    };
    let engine = EngineConfig {
        max_num_seqs: args.streams.max(16),
        max_batch_tokens: 256.max(args.streams),
        ..EngineConfig::default()
    };
    let options = RuntimeOptions {
        weight_format: args.weights,
        max_adapters,
        engine,
        adapter_precision: args.adapter_precision,
        ..RuntimeOptions::default()
    };
    Ok(Arc::new(
        LlmRuntime::load(&args.gguf, repository, options).await?,
    ))
}

fn bench_id(i: usize) -> String {
    format!("bench-{i:02}")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `p` quantile (nearest rank) of `v`; 0 for an empty `v`.
fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1));
    v.get(rank - 1).copied().unwrap_or(0.0)
}

/// One finished stream.
struct Outcome {
    ttft: Duration,
    /// From the first token to the last.
    decode: Duration,
    tokens: usize,
    end: Instant,
    /// When each token arrived.
    times: Vec<Instant>,
}

/// One request: the adapter's lease (loading it on a miss), then the whole stream.
async fn request(
    rt: Arc<LlmRuntime>,
    prompt: Arc<Vec<u32>>,
    tokens: usize,
    adapter: Option<String>,
) -> Res<Outcome> {
    let start = Instant::now();
    let lease = match &adapter {
        Some(id) => Some(rt.adapter(id).await?),
        None => None,
    };
    let mut params = SamplingParams::greedy(tokens);
    params.ignore_eos = true;
    let mut stream = rt.generate(prompt.to_vec(), params, lease)?;
    let mut first = None;
    let mut n = 0;
    let mut times = Vec::with_capacity(tokens);
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { .. } => {
                let now = Instant::now();
                first.get_or_insert(now);
                times.push(now);
                n += 1;
            }
            GenerationEvent::Finished { .. } => {
                let end = Instant::now();
                let first = first.unwrap_or(end);
                return Ok(Outcome {
                    ttft: first - start,
                    decode: end - first,
                    tokens: n,
                    end,
                    times,
                });
            }
            GenerationEvent::Error(e) => return Err(e.to_string().into()),
        }
    }
    Err("the stream ended without finishing".into())
}

/// Requests on `adapters` (one each) at once; the wall time from the first submission to the
/// last finish, and each outcome.
async fn batch(
    rt: &Arc<LlmRuntime>,
    prompt: &Arc<Vec<u32>>,
    tokens: usize,
    adapters: Vec<Option<String>>,
) -> Res<(Duration, Vec<Outcome>)> {
    let start = Instant::now();
    let mut set = JoinSet::new();
    for adapter in adapters {
        set.spawn(request(rt.clone(), prompt.clone(), tokens, adapter));
    }
    let mut outcomes = Vec::new();
    while let Some(joined) = set.join_next().await {
        outcomes.push(joined??);
    }
    let end = outcomes.iter().map(|o| o.end).max().unwrap_or(start);
    Ok((end - start, outcomes))
}

/// The streams' decode throughput together: the tokens that arrived while every stream was
/// decoding (after the last stream's first token, up to the first stream's end) over that
/// time. `None` when the streams never all decoded at once.
fn decode_throughput(outcomes: &[Outcome]) -> Option<f64> {
    let start = outcomes.iter().filter_map(|o| o.times.first()).max()?;
    let end = outcomes.iter().filter_map(|o| o.times.last()).min()?;
    let window = end.checked_duration_since(*start)?.as_secs_f64();
    let tokens = (outcomes.iter().flat_map(|o| &o.times))
        .filter(|t| *t > start && *t <= end)
        .count();
    (window > 0.0).then(|| tokens as f64 / window)
}

/// `--streams` concurrent streams, `--runs` times (after a warm-up).
async fn concurrent(args: &Args, name: &str, streams: usize, adapters: bool) -> Res<Value> {
    let rt = load(args, streams).await?;
    let prompt = Arc::new(chat_prompt(&rt)?);
    let ids: Vec<Option<String>> = (0..streams)
        .map(|i| adapters.then(|| bench_id(i)))
        .collect();
    for id in ids.iter().flatten() {
        rt.adapter(id).await?;
    }
    batch(&rt, &prompt, 2, ids.clone()).await?;
    let (mut rates, mut decode, mut ttfts, mut step_ms) = (vec![], vec![], vec![], vec![]);
    let mut decode_together = vec![];
    // With adapters, each run is paired with a run of the same streams on the base model in
    // the same runtime (before it in even runs, after it in odd ones), and the two rates are
    // compared pair by pair: the clock of a shared machine drifts between separate runs by
    // more than the difference being measured.
    let base_run = async || -> Res<f64> {
        let (wall, outcomes) = batch(&rt, &prompt, args.tokens, vec![None; streams]).await?;
        Ok(outcomes.iter().map(|o| o.tokens).sum::<usize>() as f64 / wall.as_secs_f64())
    };
    let (mut base_rates, mut paired) = (vec![], vec![]);
    for run in 0..args.runs {
        if adapters && run % 2 == 0 {
            base_rates.push(base_run().await?);
        }
        let steps = rt.engine().snapshot().steps;
        let (wall, outcomes) = batch(&rt, &prompt, args.tokens, ids.clone()).await?;
        let steps = rt.engine().snapshot().steps - steps;
        let total: usize = outcomes.iter().map(|o| o.tokens).sum();
        rates.push(total as f64 / wall.as_secs_f64());
        step_ms.push(ms(wall) / steps.max(1) as f64);
        ttfts.extend(outcomes.iter().map(|o| ms(o.ttft)));
        decode.extend(
            (outcomes.iter()).map(|o| (o.tokens.max(2) - 1) as f64 / o.decode.as_secs_f64()),
        );
        decode_together.extend(decode_throughput(&outcomes));
        if adapters && run % 2 == 1 {
            base_rates.push(base_run().await?);
        }
        if let (Some(rate), Some(base)) = (rates.last(), base_rates.last()) {
            paired.push(rate / base);
        }
    }
    let mut result = json!({
        "scenario": name, "streams": streams, "tokens": args.tokens, "runs": args.runs,
        "prompt_tokens": prompt.len(), "decode_tok_s": pct(&decode, 0.5),
        "aggregate_tok_s": pct(&rates, 0.5), "decode_all_tok_s": pct(&decode_together, 0.5),
        "ttft_median_ms": pct(&ttfts, 0.5), "ttft_max_ms": pct(&ttfts, 1.0),
        "step_ms": pct(&step_ms, 0.5),
    });
    if adapters {
        result["paired_base_aggregate_tok_s"] = json!(pct(&base_rates, 0.5));
        result["vs_base_paired"] = json!(pct(&paired, 0.5));
    }
    Ok(result)
}

fn chat_prompt(rt: &LlmRuntime) -> Res<Vec<u32>> {
    Ok(rt.chat_prompt(&[ChatMessage::new("user", QUESTION)])?)
}

async fn cycle(args: &Args) -> Res<Value> {
    let s = args.streams;
    let rounds = 4 * args.runs;
    let mut result = json!({
        "scenario": "cycle16", "streams": s, "adapters": 2 * s, "rounds": rounds,
        "tokens": args.tokens,
    });
    for (slots, label) in [(s, "cycling"), (2 * s, "cached")] {
        let rt = load(args, slots).await?;
        let prompt = Arc::new(chat_prompt(&rt)?);
        // Cycling: the second half is resident, so round 0 already evicts. Cached: all.
        let preload = if slots == s { s..2 * s } else { 0..2 * s };
        for i in preload {
            rt.adapter(&bench_id(i)).await?;
        }
        request(rt.clone(), prompt.clone(), 2, None).await?;
        let mut ttfts = Vec::new();
        let started = Instant::now();
        for k in 0..rounds {
            let ids = (0..s).map(|j| Some(bench_id((s * k + j) % (2 * s))));
            let (_, outcomes) = batch(&rt, &prompt, args.tokens, ids.collect()).await?;
            ttfts.extend(outcomes.iter().map(|o| ms(o.ttft)));
        }
        result[label] = json!({
            "slots": slots, "ttft_median_ms": pct(&ttfts, 0.5), "ttft_p90_ms": pct(&ttfts, 0.9),
            "wall_s": started.elapsed().as_secs_f64(),
        });
    }
    for q in ["median", "p90"] {
        let key = format!("ttft_{q}_ms");
        let ratio = result["cycling"][&key].as_f64().unwrap_or(0.0)
            / result["cached"][&key].as_f64().unwrap_or(f64::NAN);
        result[format!("ratio_{q}")] = json!(ratio);
    }
    Ok(result)
}

async fn adapter_load(args: &Args) -> Res<Value> {
    let rt = load(args, 8).await?;
    let dir = Path::new(args.adapters.as_deref().ok_or("--adapters is required")?);
    let id = bench_id(0);
    let base = rt.engine().model_config().clone();
    let cache = rt.adapters().ok_or("no adapter cache")?;
    let (mut loads, mut reads, mut parses) = (Vec::new(), Vec::new(), Vec::new());
    let (mut bytes, mut file_bytes, mut rank) = (0, 0, 0);
    for _ in 0..(5 * args.runs).max(5) {
        cache.evict(&id);
        let t = Instant::now();
        let lease = rt.adapter(&id).await?;
        loads.push(ms(t.elapsed()));
        (bytes, rank) = (lease.size_bytes(), lease.max_rank());
        drop(lease);
        let t = Instant::now();
        let config = std::fs::read(dir.join(&id).join(ADAPTER_CONFIG_FILE))?;
        let weights = std::fs::read(dir.join(&id).join(ADAPTER_WEIGHTS_FILE))?;
        reads.push(ms(t.elapsed()));
        file_bytes = config.len() + weights.len();
        let t = Instant::now();
        LoraAdapter::from_peft(&id, &config, &weights, &base)?;
        parses.push(ms(t.elapsed()));
    }
    let (load, read) = (pct(&loads, 0.5), pct(&reads, 0.5));
    Ok(json!({
        "scenario": "adapter_load", "adapter": id, "rank": rank, "tries": loads.len(),
        "file_bytes": file_bytes, "adapter_bytes": bytes,
        "load_ms": load, "read_ms": read, "parse_ms": pct(&parses, 0.5),
        "ratio": load / read,
    }))
}

/// (VmRSS, VmHWM) of this process, in bytes.
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

async fn memory(args: &Args) -> Res<Value> {
    let before = rss();
    let rt = load(args, args.streams).await?;
    let after_model = rss();
    let mut leases = Vec::new();
    for i in 0..args.streams {
        leases.push(rt.adapter(&bench_id(i)).await?);
    }
    let adapter_bytes: u64 = leases.iter().map(|l| l.size_bytes()).sum();
    let after_adapters = rss();
    // The chat prompt repeated up to 1024 - tokens tokens.
    let unit = chat_prompt(&rt)?;
    let len = MEMORY_SEQ_TOKENS.saturating_sub(args.tokens).max(1);
    let prompt: Vec<u32> = unit.iter().copied().cycle().take(len).collect();
    let prompt = Arc::new(prompt);
    let ids = (0..args.streams).map(|i| Some(bench_id(i))).collect();
    let (wall, _) = batch(&rt, &prompt, args.tokens, ids).await?;
    let after_run = rss();
    // What the engine reserves (and at most allocates): every sequence's prompt + max_tokens;
    // and what the prefix cache keeps of the prompts after them (each prompt's whole blocks,
    // per adapter: KV computed under different adapters differs), inside the KV budget.
    let per_token = rt.engine().kv_bytes_per_token();
    let kv = per_token * (args.streams * (prompt.len() + args.tokens)) as u64;
    let prefix = rt.engine().snapshot().prefix_cache_bytes;
    let expected = rt.weight_bytes() + adapter_bytes + kv + prefix;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    Ok(json!({
        "scenario": "memory", "streams": args.streams,
        "seq_tokens": prompt.len() + args.tokens, "run_s": wall.as_secs_f64(),
        "rss_start_mib": mib(before.0),
        "rss_model_mib": mib(after_model.0), "hwm_model_mib": mib(after_model.1),
        "rss_adapters_mib": mib(after_adapters.0), "hwm_adapters_mib": mib(after_adapters.1),
        "rss_run_mib": mib(after_run.0), "hwm_run_mib": mib(after_run.1),
        "weight_mib": mib(rt.weight_bytes()), "adapter_mib": mib(adapter_bytes),
        "kv_mib": mib(kv),
        "prefix_cache_mib": mib(prefix),
        "expected_mib": mib(expected),
        "ratio_hwm_to_expected": after_run.1 as f64 / expected as f64,
    }))
}

async fn forward(args: &Args) -> Res<Value> {
    let rt = load(args, args.streams).await?;
    let prompt = chat_prompt(&rt)?;
    // Without `--adapters`, only the base model's steps.
    let mut adapters = Vec::new();
    for i in (0..args.streams).filter(|_| args.adapters.is_some()) {
        adapters.push(rt.adapter(&bench_id(i)).await?);
    }
    let model = LlamaModel::new(LlamaWeights::load(&args.gguf, args.weights)?, 2048);
    let steps = args.tokens.min(64);
    let room = prompt.len() + 4 * steps + 1;
    let mut caches: Vec<KvCache> = (0..args.streams)
        .map(|_| KvCache::new(model.config(), model.kv_dtype(), room, None))
        .collect();
    let mut prefill = Vec::new();
    for cache in &mut caches {
        let t = Instant::now();
        let segment = Segment {
            tokens: &prompt,
            cache,
            adapter: None,
            want_logits: true,
            all_logits: false,
        };
        model.forward(&mut [segment])?;
        prefill.push(ms(t.elapsed()));
    }
    // A 256-token prefill in one segment (the prompt repeated), as the engine's
    // max_batch_tokens chunk: the prefill throughput.
    let long: Vec<u32> = prompt
        .iter()
        .copied()
        .cycle()
        .take(PREFILL_TOKENS)
        .collect();
    let mut prefill_long = Vec::new();
    for _ in 0..args.runs.max(3) {
        let mut cache = KvCache::new(model.config(), model.kv_dtype(), long.len(), None);
        let t = Instant::now();
        let segment = Segment {
            tokens: &long,
            cache: &mut cache,
            adapter: None,
            want_logits: true,
            all_logits: false,
        };
        model.forward(&mut [segment])?;
        prefill_long.push(ms(t.elapsed()));
    }
    let token = [prompt[prompt.len() - 1]];
    // Which adapters the rows use: none, one each, or the first on every row (its weights
    // read once per step: what the adapters' bytes cost, apart from their arithmetic).
    #[derive(Clone, Copy, PartialEq)]
    enum Rows {
        Base,
        Distinct,
        Shared,
    }
    let mut step = |rows: usize, kind: Rows| -> Res<f64> {
        let mut segments: Vec<Segment<'_>> = (caches.iter_mut().enumerate().take(rows))
            .map(|(i, cache)| Segment {
                tokens: &token,
                cache,
                adapter: match kind {
                    Rows::Base => None,
                    Rows::Distinct => Some(&*adapters[i]),
                    Rows::Shared => Some(&*adapters[0]),
                },
                want_logits: true,
                all_logits: false,
            })
            .collect();
        let t = Instant::now();
        model.forward(&mut segments)?;
        Ok(ms(t.elapsed()))
    };
    let one = (0..steps)
        .map(|_| step(1, Rows::Base))
        .collect::<Res<Vec<_>>>()?;
    // The kinds of step alternate, so all attend over the same lengths of context (each step
    // adds a position to every cache).
    let (mut base, mut lora, mut shared) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..steps {
        base.push(step(args.streams, Rows::Base)?);
        if !adapters.is_empty() {
            lora.push(step(args.streams, Rows::Distinct)?);
            shared.push(step(args.streams, Rows::Shared)?);
        }
    }
    let (one, base) = (pct(&one, 0.5), pct(&base, 0.5));
    let median = |v: &[f64]| (!v.is_empty()).then(|| pct(v, 0.5));
    let (lora, shared) = (median(&lora), median(&shared));
    Ok(json!({
        "scenario": "forward", "rows": args.streams, "prompt_tokens": prompt.len(),
        "prefill_ms": pct(&prefill, 0.5),
        "prefill256_ms": pct(&prefill_long, 0.5), "step1_ms": one, "step_base_ms": base,
        "step_adapters_ms": lora, "step_one_adapter_ms": shared, "steps": steps,
    }))
}

async fn prompt(args: &Args) -> Res<Value> {
    let rt = load(args, 1).await?;
    let ids = chat_prompt(&rt)?;
    Ok(json!({
        "scenario": "prompt", "ids": ids, "weight_bytes": rt.weight_bytes(),
        "kv_bytes_per_token": rt.engine().kv_bytes_per_token(),
        "kernel": modelmux_kernels::Isa::detect().name(),
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = parse_args().unwrap_or_else(|e| {
        eprintln!("bench_llm: {e}\nusage: bench_llm --gguf PATH [--adapters DIR] --scenario prompt|single|base8|adapters8|cycle16|adapter_load|memory|forward [--tokens 64] [--streams 8] [--runs 3] [--weights auto|q8_0|as-stored|f32]");
        std::process::exit(2);
    });
    let result = match args.scenario.as_str() {
        "prompt" => prompt(&args).await,
        "single" => concurrent(&args, "single", 1, false).await,
        "base8" => concurrent(&args, "base8", args.streams, false).await,
        "adapters8" => concurrent(&args, "adapters8", args.streams, true).await,
        "cycle16" => cycle(&args).await,
        "adapter_load" => adapter_load(&args).await,
        "memory" => memory(&args).await,
        "forward" => forward(&args).await,
        other => Err(format!("unknown scenario {other}").into()),
    };
    match result {
        Ok(value) => println!("{value}"),
        Err(e) => {
            eprintln!("bench_llm {}: {e}", args.scenario);
            std::process::exit(1);
        }
    }
}
