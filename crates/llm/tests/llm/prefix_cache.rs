//! The prefix cache on SmolLM2: a repeated prompt starts from its cached blocks and answers as
//! if computed whole; the cache is shared only under the same adapter *content* and cache salt
//! (an adapter reloaded under its name with other weights shares nothing: vllm#42125; another
//! adapter never reuses the base model's or another adapter's KV: llama.cpp#26207); entries
//! give their memory back to sequences, and the budget holds under many requests mixing
//! cached prefixes with long new prompts; `reset_prefix_cache` drops them.

use crate::common;

use std::sync::Arc;

use common::{env_path, runtime};
use modelmux_llm::{
    AdapterLease, Engine, EngineConfig, GenerationEvent, GenerationRequest, LoraAdapter,
    SamplingParams,
};

/// A prompt of `len` tokens, the same for every call with the same `seed`.
fn prompt(len: usize, seed: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| 200 + (i * 37 + seed * 101) % 9000)
        .collect()
}

fn config(prefix_caching: bool) -> EngineConfig {
    EngineConfig {
        max_num_seqs: 4,
        max_model_len: 512,
        max_batch_tokens: 24,
        enable_prefix_caching: prefix_caching,
        ..EngineConfig::default()
    }
}

/// Greedy tokens and each one's log probability.
async fn generate(
    engine: &Engine,
    prompt: &[u32],
    adapter: Option<&Arc<LoraAdapter>>,
    salt: Option<&str>,
) -> (Vec<u32>, Vec<f32>) {
    let mut stream = engine
        .submit(GenerationRequest {
            prompt: prompt.to_vec(),
            params: SamplingParams {
                logprobs: Some(0),
                cache_salt: salt.map(str::to_owned),
                ..SamplingParams::greedy(6)
            },
            adapter: adapter.map(|a| AdapterLease::new(a.clone())),
            constraint: None,
        })
        .unwrap();
    let (mut tokens, mut logprobs) = (Vec::new(), Vec::new());
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token { id, logprob, .. } => {
                tokens.push(id);
                logprobs.push(logprob.expect("asked for").logprob);
            }
            GenerationEvent::Finished { .. } => break,
            GenerationEvent::Error(e) => panic!("{e}"),
        }
    }
    (tokens, logprobs)
}

/// The same answer, up to the rounding of a prompt computed in other chunks.
fn assert_same(got: &(Vec<u32>, Vec<f32>), want: &(Vec<u32>, Vec<f32>)) {
    assert_eq!(got.0, want.0, "tokens");
    for (g, w) in got.1.iter().zip(&want.1) {
        assert!(
            (g - w).abs() < 2e-3,
            "log probabilities {:?} vs {:?}",
            got.1,
            want.1
        );
    }
}

/// KV bytes one token of SmolLM2 takes in the engine's cache.
fn kv_bytes_per_token() -> u64 {
    let model = runtime().model();
    model.config().kv_bytes_per_token(model.kv_dtype())
}

/// Prompt tokens the engine found cached so far.
fn hits(engine: &Engine) -> u64 {
    engine.snapshot().prefix_cache_hits
}

fn adapter_from(dir: &str, id: &str) -> Arc<LoraAdapter> {
    let dir = env_path("MODELMUX_TEST_ADAPTERS").join(dir);
    let config = std::fs::read(dir.join("adapter_config.json")).unwrap();
    let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
    Arc::new(LoraAdapter::from_peft(id, &config, &weights, runtime().model().config()).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_prompt_starts_from_its_cached_blocks_and_answers_as_computed_whole() {
    let engine = runtime().engine(config(true));
    let whole = runtime().engine(config(false));
    let p = prompt(70, 1);
    let first = generate(&engine, &p, None, None).await;
    assert_eq!(hits(&engine), 0);
    assert_eq!(engine.snapshot().prefix_cache_queries, 70);
    assert!(
        engine.snapshot().prefix_cache_bytes > 0,
        "the prompt's blocks are kept"
    );
    let second = generate(&engine, &p, None, None).await;
    // 4 whole blocks of 16; the rest (6 tokens) computed, in chunks of the step's budget.
    assert_eq!(hits(&engine), 64);
    assert_same(&second, &first);
    assert_same(&second, &generate(&whole, &p, None, None).await);
    assert_eq!(whole.snapshot().prefix_cache_hits, 0);
    assert_eq!(whole.snapshot().prefix_cache_bytes, 0);
    // A prompt sharing the first 40 tokens reuses two blocks.
    let mut other = p[..40].to_vec();
    other.extend(prompt(20, 9));
    let before = hits(&engine);
    let answer = generate(&engine, &other, None, None).await;
    assert_eq!(hits(&engine) - before, 32);
    assert_same(&answer, &generate(&whole, &other, None, None).await);
    common::settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_are_shared_only_under_the_same_adapter_content_and_salt() {
    let engine = runtime().engine(config(true));
    let whole = runtime().engine(config(false));
    let p = prompt(50, 2);
    let pirate = adapter_from("pirate", "pirate");
    generate(&engine, &p, None, None).await;
    // The base model's KV is not the adapter's: nothing shared, and the answer is the
    // adapter's own.
    let with_adapter = generate(&engine, &p, Some(&pirate), None).await;
    assert_eq!(hits(&engine), 0);
    assert_same(
        &with_adapter,
        &generate(&whole, &p, Some(&pirate), None).await,
    );
    // The same adapter again: shared.
    generate(&engine, &p, Some(&pirate), None).await;
    assert_eq!(hits(&engine), 48);
    // The same name with other weights (a reload after the files changed): nothing shared.
    let reloaded = adapter_from("poet", "pirate");
    assert_eq!(reloaded.id(), pirate.id());
    let answer = generate(&engine, &p, Some(&reloaded), None).await;
    assert_eq!(hits(&engine), 48);
    assert_same(&answer, &generate(&whole, &p, Some(&reloaded), None).await);
    // The same files loaded again under another name: the same content, shared.
    let renamed = adapter_from("pirate", "pirate-copy");
    generate(&engine, &p, Some(&renamed), None).await;
    assert_eq!(hits(&engine), 96);

    // Tenants with different salts share nothing; the same salt shares.
    let q = prompt(40, 3);
    generate(&engine, &q, None, Some("tenant-a")).await;
    let before = hits(&engine);
    generate(&engine, &q, None, Some("tenant-b")).await;
    generate(&engine, &q, None, None).await;
    assert_eq!(hits(&engine), before);
    generate(&engine, &q, None, Some("tenant-a")).await;
    assert_eq!(hits(&engine), before + 32);
    common::settled(&engine).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_prefixes_give_their_memory_to_sequences_and_reset_drops_them() {
    let per_token = kv_bytes_per_token();
    // Room for one sequence of 260 tokens (prompt + max_tokens), no more.
    let engine = runtime().engine(EngineConfig {
        kv_cache_bytes: per_token * 260,
        max_model_len: 256,
        ..config(true)
    });
    let p = prompt(100, 4);
    generate(&engine, &p, None, None).await;
    let kept = engine.snapshot().prefix_cache_bytes;
    assert_eq!(kept, 96 * per_token);
    // A long prompt needs the whole budget: the cached prefix makes room for it.
    let long = prompt(250, 5);
    generate(&engine, &long, None, None).await;
    assert!(engine.snapshot().kv_reserved_bytes <= engine.snapshot().kv_capacity_bytes);
    generate(&engine, &p, None, None).await;
    assert_eq!(
        hits(&engine),
        0,
        "the first prompt's prefix was evicted for the long one"
    );

    generate(&engine, &p, None, None).await;
    assert_eq!(hits(&engine), 96);
    engine.reset_prefix_cache().await.unwrap();
    assert_eq!(
        engine.snapshot().prefix_cache_bytes,
        0,
        "the reset is done when it returns"
    );
    generate(&engine, &p, None, None).await;
    assert_eq!(hits(&engine), 96, "nothing cached after the reset");
    common::settled(&engine).await;
    assert_eq!(
        engine.snapshot().prefix_cache_bytes,
        96 * per_token,
        "once idle, the cache's entries hold KV memory, counted apart from sequences'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_choices_of_an_n_request_start_from_a_cached_prefix_and_answer_as_computed_whole() {
    let engine = runtime().engine(config(true));
    let whole = runtime().engine(config(false));
    let p = prompt(60, 6);
    let request = || GenerationRequest {
        prompt: p.clone(),
        params: SamplingParams::greedy(5),
        adapter: None,
        constraint: None,
    };
    generate(&engine, &p, None, None).await;
    let computed = engine.snapshot().prompt_tokens;
    let cached = engine.submit_choices(request(), 3).unwrap();
    let uncached = whole.submit_choices(request(), 3).unwrap();
    for (cached, uncached) in cached.into_iter().zip(uncached) {
        let (cached, uncached) = (
            cached.collect().await.unwrap(),
            uncached.collect().await.unwrap(),
        );
        assert_eq!(cached.tokens, uncached.tokens);
    }
    assert_eq!(
        hits(&engine),
        48,
        "three blocks of the prompt came from the cache"
    );
    // Only the prompt's last 12 tokens were computed, once for the three choices.
    assert_eq!(engine.snapshot().prompt_tokens - computed, 12);
    common::settled(&engine).await;
}

/// The KV budget under a mix: 32 requests at once, half of them sharing four 96-token system
/// prompts, half long new prompts (200-230 tokens) whose blocks are cached too. The budget
/// (2400 tokens) holds the four running sequences and only part of what the run leaves to
/// cache, so entries are evicted for new entries and for sequences as it goes. A monitor
/// samples the engine all along: neither the sequences' reservations nor the cache's
/// entries ever pass the budget; every request finishes whole; the system prompts are
/// reused (at least 6 of their 12 possible reuses) and the cache gives memory back; at the
/// end nothing is held but the cache's entries, which a reset frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kv_budget_holds_under_cached_prefixes_mixed_with_long_new_prompts() {
    let per_token = kv_bytes_per_token();
    let engine = Arc::new(runtime().engine(EngineConfig {
        kv_cache_bytes: per_token * 2400,
        max_model_len: 256,
        max_batch_tokens: 64,
        // 32 requests queue for 4 slots: on a loaded machine the last ones wait longer
        // than the default 30 s, and this test is about the budget, not the wait.
        queue_timeout: std::time::Duration::from_secs(120),
        ..config(true)
    }));
    let systems: Vec<Vec<u32>> = (0..4).map(|s| prompt(96, 20 + s)).collect();
    let prompts: Vec<Vec<u32>> = (0..32u32)
        .map(|i| {
            if i % 2 == 0 {
                let mut p = systems[(i / 2 % 4) as usize].clone();
                p.extend(prompt(8 + (i as usize % 5) * 3, 100 + i));
                p
            } else {
                prompt(200 + (i as usize % 4) * 10, 300 + i)
            }
        })
        .collect();

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let monitor = {
        let (engine, done) = (engine.clone(), done.clone());
        tokio::spawn(async move {
            let (mut samples, mut most_cached, mut gave_back) = (0u64, 0u64, false);
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                let s = engine.snapshot();
                assert!(s.kv_reserved_bytes <= s.kv_capacity_bytes, "{s:?}");
                assert!(s.prefix_cache_bytes <= s.kv_capacity_bytes, "{s:?}");
                gave_back |= s.prefix_cache_bytes < most_cached;
                most_cached = most_cached.max(s.prefix_cache_bytes);
                samples += 1;
                tokio::time::sleep(std::time::Duration::from_micros(200)).await;
            }
            (samples, most_cached, gave_back)
        })
    };
    let requests: Vec<_> = prompts
        .into_iter()
        .map(|p| {
            let engine = engine.clone();
            tokio::spawn(async move { generate(&engine, &p, None, None).await })
        })
        .collect();
    let answers = tokio::time::timeout(std::time::Duration::from_secs(240), async {
        let mut answers = Vec::new();
        for request in requests {
            answers.push(request.await);
        }
        answers
    })
    .await
    .expect("every request finishes");
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let (samples, most_cached, gave_back) = monitor.await.unwrap();
    for answer in answers {
        assert_eq!(
            answer.unwrap().0.len(),
            6,
            "each request gets all its tokens"
        );
    }
    assert!(samples > 10, "the monitor saw the run ({samples} samples)");
    assert!(
        hits(&engine) >= 6 * 96,
        "the system prompts were reused: {:?}",
        engine.snapshot()
    );
    assert!(
        gave_back,
        "the cache gave memory back during the run (at most {most_cached} bytes)"
    );
    common::settled(&engine).await;
    let s = engine.snapshot();
    assert!(s.prefix_cache_bytes > 0 && s.prefix_cache_bytes <= s.kv_capacity_bytes);
    engine.reset_prefix_cache().await.unwrap();
    let s = engine.snapshot();
    assert_eq!((s.prefix_cache_bytes, s.kv_reserved_bytes), (0, 0), "{s:?}");
}
