//! Property test: random interleavings of get / release / evict / fail / pin / time passing,
//! with the invariants checked after every step against the instrumented model's ground truth.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Held, Probe, TestLoader, TestModel, settle};
use modelmux_cache::{EvictionPolicy, Multiplexer};
use parking_lot::Mutex;
use proptest::prelude::*;

const IDS: [&str; 6] = ["m0", "m1", "m2", "m3", "m4", "m5"];
const SIZES: [u64; 6] = [1, 2, 3, 1, 2, 4];
const DELAYS_MS: [u64; 6] = [0, 5, 20, 50, 100, 0];

#[derive(Debug, Clone)]
enum Op {
    Get(usize),
    Release(usize),
    Evict(usize),
    SetFailing(usize, bool),
    Pin(usize),
    Unpin(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let id = 0..IDS.len();
    prop_oneof![
        5 => id.clone().prop_map(Op::Get),
        3 => any::<usize>().prop_map(Op::Release),
        1 => id.clone().prop_map(Op::Evict),
        1 => (id.clone(), any::<bool>()).prop_map(|(i, f)| Op::SetFailing(i, f)),
        1 => id.clone().prop_map(Op::Pin),
        1 => id.prop_map(Op::Unpin),
        3 => (0..150u64).prop_map(Op::Advance),
    ]
}

fn check(
    mux: &Multiplexer<TestModel>,
    probe: &Probe,
    max_models: usize,
    max_bytes: u64,
    step: usize,
) {
    let g = mux.gauges();
    assert!(
        g.used_slots <= max_models,
        "step {step}: {g:?} over max_models {max_models}"
    );
    assert!(
        g.used_bytes <= max_bytes,
        "step {step}: {g:?} over max_bytes {max_bytes}"
    );
    let live = probe.live.load(Ordering::SeqCst);
    assert!(
        live <= max_models,
        "step {step}: {live} instances alive, cap {max_models}"
    );
    let bytes = probe.live_bytes.load(Ordering::SeqCst);
    assert!(
        bytes <= max_bytes,
        "step {step}: {bytes} bytes alive, cap {max_bytes}"
    );
    let loaded = mux.loaded_ids();
    for id in mux.loading_ids() {
        assert!(
            !loaded.contains(&id),
            "step {step}: '{id}' is both loaded and loading"
        );
    }
    probe.assert_clean();
}

/// Model sizes: known in advance (each its own, told by the loader's probe), or `Unknown`: one
/// shape for all (the multiplexed case), told only by the loaded model.
#[derive(Debug, Clone, Copy)]
enum Sizes {
    Known,
    Unknown(u64),
}

async fn run(
    ops: Vec<Op>,
    max_models: usize,
    max_bytes: u64,
    policy: EvictionPolicy,
    sizes: Sizes,
) {
    let probe = Probe::new();
    probe
        .hint_sizes
        .store(matches!(sizes, Sizes::Known), Ordering::SeqCst);
    for i in 0..IDS.len() {
        let size = match sizes {
            Sizes::Known => SIZES[i],
            Sizes::Unknown(shape) => shape,
        };
        probe.sizes.lock().insert(IDS[i].into(), size);
        probe
            .delay
            .lock()
            .insert(IDS[i].into(), Duration::from_millis(DELAYS_MS[i]));
    }
    let mux = Multiplexer::builder()
        .max_models(max_models)
        .max_bytes(max_bytes)
        .eviction_policy(policy)
        .capacity_timeout(Duration::from_millis(300))
        .load_timeout(Some(Duration::from_secs(1)))
        .failure_backoff(Duration::from_millis(100), Duration::from_millis(400))
        .build(TestLoader(probe.clone()));
    let held: Arc<Mutex<Vec<Held>>> = Arc::default();

    for (step, op) in ops.into_iter().enumerate() {
        match op {
            Op::Get(i) => {
                let (mux, held) = (mux.clone(), held.clone());
                tokio::spawn(async move {
                    if let Ok(guard) = mux.get(IDS[i]).await {
                        held.lock().push(Held::new(guard));
                    }
                });
            }
            Op::Release(k) => {
                let mut held = held.lock();
                if !held.is_empty() {
                    let n = held.len();
                    held.swap_remove(k % n);
                }
            }
            Op::Evict(i) => {
                mux.evict(IDS[i]);
            }
            Op::SetFailing(i, failing) => {
                let mut fail = probe.fail.lock();
                if failing {
                    fail.insert(IDS[i].into());
                } else {
                    fail.remove(IDS[i]);
                }
            }
            Op::Pin(i) => {
                let mux = mux.clone();
                tokio::spawn(async move { mux.pin(IDS[i]).await });
            }
            Op::Unpin(i) => {
                mux.unpin(IDS[i]);
            }
            Op::Advance(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
        settle().await;
        check(&mux, &probe, max_models, max_bytes, step);
    }

    // Release everything, let every load finish or time out, and shut down.
    held.lock().clear();
    tokio::time::sleep(Duration::from_secs(5)).await;
    held.lock().clear();
    let report = mux.shutdown(Duration::from_secs(5)).await;
    assert!(report.still_draining.is_empty(), "{report:?}");
    settle().await;
    probe.assert_all_unloaded_once();
    probe.assert_clean();
    // The peaks, not only the states seen between steps: no moment overcommitted the caps.
    let peak = probe.max_live_bytes.load(Ordering::SeqCst);
    assert!(
        peak <= max_bytes,
        "{peak} bytes alive at once, cap {max_bytes}"
    );
    let peak = probe.max_live.load(Ordering::SeqCst);
    assert!(
        peak <= max_models,
        "{peak} instances alive at once, cap {max_models}"
    );
    assert_eq!(mux.gauges().used_slots, 0);
    assert_eq!(mux.gauges().used_bytes, 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_any_interleaving(
        ops in proptest::collection::vec(op(), 1..80),
        max_models in 1..4usize,
        max_bytes in 4..10u64,
        gdsf in any::<bool>(),
        unknown in proptest::option::of(1..4u64),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        let policy = if gdsf { EvictionPolicy::Gdsf } else { EvictionPolicy::Lru };
        let sizes = unknown.map_or(Sizes::Known, Sizes::Unknown);
        rt.block_on(run(ops, max_models, max_bytes, policy, sizes));
    }
}
