//! Stress: many tasks on the multi-threaded runtime hammer a small cache with a skewed mix of
//! ids, failures, evictions and pins, while a checker samples the invariants continuously.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::{Held, Probe, TestLoader};
use modelmux_cache::{Error, Multiplexer};

const MAX_MODELS: usize = 4;
const MAX_BYTES: u64 = 10;
const IDS: usize = 12;

/// A small deterministic generator (xorshift), one per task.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Skewed towards low ids (a popular few, a long tail).
    fn id(&mut self) -> String {
        let a = self.next() % IDS as u64;
        let b = self.next() % IDS as u64;
        format!("m{}", a.min(b))
    }
}

#[test]
fn many_tasks_keep_every_invariant() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let probe = Probe::new();
        probe.hint_sizes.store(true, Ordering::SeqCst);
        for i in 0..IDS {
            probe
                .sizes
                .lock()
                .insert(format!("m{i}"), 1 + (i as u64 % 4));
        }
        *probe.default_delay.lock() = Duration::from_micros(300);
        probe.fail.lock().insert("m7".into());
        let mux = Multiplexer::builder()
            .max_models(MAX_MODELS)
            .max_bytes(MAX_BYTES)
            .max_concurrent_loads(3)
            .capacity_timeout(Duration::from_secs(5))
            .failure_backoff(Duration::from_millis(1), Duration::from_millis(4))
            .build(TestLoader(probe.clone()));

        let stop = Arc::new(AtomicBool::new(false));
        let checks = Arc::new(AtomicU64::new(0));
        let checker = tokio::spawn({
            let (mux, probe, stop, checks) =
                (mux.clone(), probe.clone(), stop.clone(), checks.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let g = mux.gauges();
                    assert!(g.used_slots <= MAX_MODELS, "{g:?}");
                    assert!(g.used_bytes <= MAX_BYTES, "{g:?}");
                    assert!(probe.live.load(Ordering::SeqCst) <= MAX_MODELS);
                    assert!(probe.live_bytes.load(Ordering::SeqCst) <= MAX_BYTES);
                    checks.fetch_add(1, Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            }
        });

        let outcomes = Arc::new(parking_lot::Mutex::new(std::collections::HashMap::<
            &str,
            u64,
        >::new()));
        let workers: Vec<_> = (0..32u64)
            .map(|t| {
                let (mux, outcomes) = (mux.clone(), outcomes.clone());
                tokio::spawn(async move {
                    let mut rng =
                        Rng(0x9E37_79B9_7F4A_7C15 ^ (t + 1).wrapping_mul(0x2545_F491_4F6C_DD1D));
                    for _ in 0..250 {
                        let id = rng.id();
                        let kind = match rng.next() % 100 {
                            0..=2 => {
                                mux.evict(&id);
                                "evict"
                            }
                            3..=4 => {
                                let _ = mux.pin(&id).await;
                                mux.unpin(&id);
                                "pin"
                            }
                            _ => match mux.get(&id).await {
                                Ok(guard) => {
                                    let held = Held::new(guard);
                                    if rng.next().is_multiple_of(4) {
                                        tokio::time::sleep(Duration::from_micros(200)).await;
                                    } else {
                                        tokio::task::yield_now().await;
                                    }
                                    assert_eq!(held.0.id().as_str(), id);
                                    "ok"
                                }
                                Err(Error::LoadFailed { .. } | Error::BackingOff { .. }) => {
                                    "failed"
                                }
                                Err(Error::CapacityExhausted { .. }) => "capacity",
                                Err(e) => panic!("unexpected error: {e}"),
                            },
                        };
                        *outcomes.lock().entry(kind).or_default() += 1;
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        stop.store(true, Ordering::SeqCst);
        checker.await.unwrap();

        let report = mux.shutdown(Duration::from_secs(10)).await;
        assert!(report.still_draining.is_empty(), "{report:?}");
        probe.assert_all_unloaded_once();
        probe.assert_clean();
        assert!(probe.max_live.load(Ordering::SeqCst) <= MAX_MODELS);
        assert!(probe.max_live_bytes.load(Ordering::SeqCst) <= MAX_BYTES);
        let outcomes = outcomes.lock();
        assert!(outcomes["ok"] > 4000, "{outcomes:?}");
        assert!(outcomes["failed"] > 0, "{outcomes:?}");
        assert!(checks.load(Ordering::Relaxed) > 100);
        let m = mux.metrics();
        assert!(m.loads > 50 && m.evictions > 0, "{m:?}");
        eprintln!(
            "stress: {outcomes:?}, {} loads, {} evictions, {} invariant checks",
            m.loads,
            m.evictions,
            checks.load(Ordering::Relaxed)
        );
    });
}

/// Single flight under threads: a barrier-started burst of gets for one id, on four worker
/// threads, loads it once and hands every caller that one instance, 200 times over (the
/// behaviour tests check it on one thread, where a burst cannot truly race).
#[test]
fn a_burst_of_gets_for_one_id_loads_it_once_on_every_thread() {
    const ROUNDS: usize = 200;
    const BURST: usize = 32;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let probe = Probe::new();
        *probe.default_delay.lock() = Duration::from_micros(500);
        let mux = Multiplexer::builder()
            .max_models(ROUNDS)
            .build(TestLoader(probe.clone()));
        for round in 0..ROUNDS {
            let id = format!("burst-{round}");
            let barrier = Arc::new(tokio::sync::Barrier::new(BURST));
            let gets: Vec<_> = (0..BURST)
                .map(|_| {
                    let (mux, barrier, id) = (mux.clone(), barrier.clone(), id.clone());
                    tokio::spawn(async move {
                        barrier.wait().await;
                        mux.get(&id).await.expect("loads").serial
                    })
                })
                .collect();
            let mut serials = std::collections::HashSet::new();
            for g in gets {
                serials.insert(g.await.unwrap());
            }
            assert_eq!(probe.loads_of(&id), 1, "round {round}: loads of {id}");
            assert_eq!(serials.len(), 1, "round {round}: instances {serials:?}");
        }
        let report = mux.shutdown(Duration::from_secs(10)).await;
        assert!(report.still_draining.is_empty(), "{report:?}");
        probe.assert_all_unloaded_once();
        probe.assert_clean();
    });
}
