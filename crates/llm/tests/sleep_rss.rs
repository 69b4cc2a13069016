//! An LLM runtime asleep gives its weights' memory back to the operating system, and takes
//! it again on waking (the README's "188 → 75 MB"): measured as this process's resident set,
//! so it is its own test binary with one test (other tests' allocations would blur it). Two
//! runtimes over one file share one copy: one asleep frees nothing, both asleep free it.

use std::path::PathBuf;
use std::time::Duration;

use modelmux_llm::{LlmRuntime, RuntimeOptions, SamplingParams, WeightsState};

/// This process's resident set, in bytes (`/proc/self/statm`'s second field, in pages).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

async fn load() -> LlmRuntime {
    let gguf = std::env::var("MODELMUX_TEST_GGUF")
        .unwrap_or_else(|_| panic!("MODELMUX_TEST_GGUF is not set: run ./scripts/test"));
    let options = RuntimeOptions {
        model_id: "smollm2".into(),
        ..RuntimeOptions::default()
    };
    LlmRuntime::load(PathBuf::from(gguf), None, options)
        .await
        .unwrap()
}

async fn generate(rt: &LlmRuntime) {
    let prompt = rt.tokenizer().encode("Hello", false).unwrap();
    let stream = rt
        .generate(prompt, SamplingParams::greedy(4), None)
        .unwrap();
    assert!(!stream.collect().await.unwrap().tokens.is_empty());
}

async fn set_asleep(rt: &LlmRuntime, asleep: bool) {
    if asleep {
        rt.engine().sleep().unwrap();
    } else {
        rt.engine().wake_up();
    }
    let want = if asleep {
        WeightsState::Released
    } else {
        WeightsState::Loaded
    };
    let state = rt
        .engine()
        .wait_for_weights(|w| *w == want, Duration::from_secs(60))
        .await;
    assert_eq!(state, Some(want));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sleeping_runtimes_give_their_weights_memory_back_and_share_it_awake() {
    let a = load().await;
    generate(&a).await;
    let weights = a.weight_bytes();
    let awake = rss();
    // The weights, and most of the file's bytes, are resident while awake.
    assert!(
        awake > weights,
        "awake: {:.0} MiB resident, weights {:.0} MiB",
        mib(awake),
        mib(weights)
    );

    set_asleep(&a, true).await;
    let asleep = rss();
    assert!(
        awake.saturating_sub(asleep) >= weights * 8 / 10,
        "asleep the process went from {:.0} to {:.0} MiB: less than the weights' {:.0} MiB came back",
        mib(awake),
        mib(asleep),
        mib(weights)
    );

    set_asleep(&a, false).await;
    generate(&a).await;
    let woken = rss();
    assert!(
        woken.saturating_sub(asleep) >= weights * 8 / 10,
        "woken: {:.0} MiB resident, asleep {:.0}: the weights are not back",
        mib(woken),
        mib(asleep)
    );

    // A second runtime over the same file shares the first one's weights: it adds far less
    // than another copy (its tokenizer and engine add some 30 MiB), and one of the two asleep gives nothing back.
    let b = load().await;
    generate(&b).await;
    let both = rss();
    assert!(
        both.saturating_sub(woken) < weights / 2,
        "a second runtime added {:.0} MiB to {:.0}: it read its own copy of {:.0} MiB",
        mib(both.saturating_sub(woken)),
        mib(woken),
        mib(weights)
    );
    set_asleep(&a, true).await;
    let one = rss();
    assert!(
        both.saturating_sub(one) < weights / 2,
        "with one runtime asleep, {:.0} MiB went: the other's weights went with it",
        mib(both.saturating_sub(one))
    );
    generate(&b).await;
    set_asleep(&b, true).await;
    let none = rss();
    eprintln!(
        "resident MiB: awake {:.0}, asleep {:.0}, woken {:.0}, two runtimes {:.0}, one asleep {:.0}, both asleep {:.0} (weights {:.0})",
        mib(awake),
        mib(asleep),
        mib(woken),
        mib(both),
        mib(one),
        mib(none),
        mib(weights)
    );
    assert!(
        one.saturating_sub(none) >= weights * 8 / 10,
        "both asleep, the process went from {:.0} to {:.0} MiB: the shared weights ({:.0} MiB) stayed",
        mib(one),
        mib(none),
        mib(weights)
    );
}
