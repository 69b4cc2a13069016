//! An instrumented model and loader: they count, independently of the cache, how many model
//! instances exist, how many bytes they hold, and how often each was unloaded, so tests check
//! the cache's invariants against ground truth rather than against its own accounting.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use modelmux_cache::{BoxError, Loader, Model, ModelGuard, ModelId};
use parking_lot::Mutex;

/// How a model's unload hook behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnloadBehaviour {
    Ok,
    Err,
    Panic,
    /// Never returns.
    Hang,
}

#[derive(Default)]
pub struct Probe {
    /// Loader calls per id.
    pub loads: Mutex<HashMap<String, usize>>,
    /// Unload-hook runs per instance serial.
    pub unloads: Mutex<HashMap<u64, usize>>,
    /// Serials of instances that finished loading.
    pub loaded_serials: Mutex<HashSet<u64>>,
    /// Anything that broke an invariant, as text.
    pub violations: Mutex<Vec<String>>,
    next_serial: AtomicU64,
    /// Instances alive: from the start of their load to the end of their unload (or failure).
    pub live: AtomicUsize,
    pub max_live: AtomicUsize,
    pub live_bytes: AtomicU64,
    pub max_live_bytes: AtomicU64,
    /// Loader calls running now, and the most at once.
    pub loading_now: AtomicUsize,
    pub max_loading: AtomicUsize,
    /// Ids whose load fails / panics; per-id load delay and size.
    pub fail: Mutex<HashSet<String>>,
    pub panic: Mutex<HashSet<String>>,
    pub delay: Mutex<HashMap<String, Duration>>,
    pub default_delay: Mutex<Duration>,
    pub sizes: Mutex<HashMap<String, u64>>,
    /// Whether the loader tells sizes in advance through `probe`.
    pub hint_sizes: std::sync::atomic::AtomicBool,
    /// Ids whose probe says they do not exist; probe calls per id.
    pub missing: Mutex<HashSet<String>>,
    /// Ids whose probe does not tell the size; ids whose `size_bytes` panics.
    pub unknown_size: Mutex<HashSet<String>>,
    pub size_panics: Mutex<HashSet<String>>,
    pub probes: Mutex<HashMap<String, usize>>,
    pub unload_behaviour: Mutex<HashMap<String, UnloadBehaviour>>,
    pub unload_delay: Mutex<Duration>,
}

impl Probe {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub fn loads_of(&self, id: &str) -> usize {
        self.loads.lock().get(id).copied().unwrap_or(0)
    }

    pub fn total_loads(&self) -> usize {
        self.loads.lock().values().sum()
    }

    pub fn total_unloads(&self) -> usize {
        self.unloads.lock().values().sum()
    }

    pub fn size_of(&self, id: &str) -> u64 {
        self.sizes.lock().get(id).copied().unwrap_or(1)
    }

    pub fn violation(&self, what: String) {
        self.violations.lock().push(what);
    }

    pub fn assert_clean(&self) {
        let v = self.violations.lock();
        assert!(v.is_empty(), "invariant violations: {v:#?}");
    }

    /// Every instance that finished loading was unloaded exactly once.
    pub fn assert_all_unloaded_once(&self) {
        let loaded = self.loaded_serials.lock();
        let unloads = self.unloads.lock();
        for serial in loaded.iter() {
            assert_eq!(
                unloads.get(serial).copied().unwrap_or(0),
                1,
                "instance {serial} unload count"
            );
        }
        assert_eq!(self.live.load(Ordering::SeqCst), 0, "instances still alive");
        assert_eq!(
            self.live_bytes.load(Ordering::SeqCst),
            0,
            "bytes still held"
        );
    }

    fn enter(&self, bytes: u64) {
        let live = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_live.fetch_max(live, Ordering::SeqCst);
        let b = self.live_bytes.fetch_add(bytes, Ordering::SeqCst) + bytes;
        self.max_live_bytes.fetch_max(b, Ordering::SeqCst);
    }

    fn leave(&self, bytes: u64) {
        self.live.fetch_sub(1, Ordering::SeqCst);
        self.live_bytes.fetch_sub(bytes, Ordering::SeqCst);
    }
}

/// Counts an instance as alive until dropped (so a cancelled or failed load leaves too).
struct Life {
    probe: Arc<Probe>,
    bytes: u64,
}

impl Drop for Life {
    fn drop(&mut self) {
        self.probe.leave(self.bytes);
    }
}

pub struct TestModel {
    pub id: String,
    pub serial: u64,
    pub size: u64,
    /// Users the test has marked (see [`Held`]). Must be zero when the unload hook runs.
    pub users: AtomicUsize,
    probe: Arc<Probe>,
    life: Option<Life>,
}

impl Model for TestModel {
    fn size_bytes(&self) -> Option<u64> {
        if self.probe.size_panics.lock().contains(&self.id) {
            panic!("size of {} unknowable", self.id);
        }
        Some(self.size)
    }

    async fn unload(mut self) -> Result<(), BoxError> {
        let probe = self.probe.clone();
        // Both checks below hold by construction today (the hook consumes the model, and only the
        // last reference's drop can call it); they stand guard against a refactor that breaks it.
        let users = self.users.load(Ordering::SeqCst);
        if users != 0 {
            probe.violation(format!(
                "{} #{} unloaded with {users} users",
                self.id, self.serial
            ));
        }
        let n = {
            let mut unloads = probe.unloads.lock();
            let n = unloads.entry(self.serial).or_default();
            *n += 1;
            *n
        };
        if n > 1 {
            probe.violation(format!("{} #{} unloaded {n} times", self.id, self.serial));
        }
        let delay = *probe.unload_delay.lock();
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        drop(self.life.take());
        let behaviour = probe
            .unload_behaviour
            .lock()
            .get(&self.id)
            .copied()
            .unwrap_or(UnloadBehaviour::Ok);
        match behaviour {
            UnloadBehaviour::Ok => Ok(()),
            UnloadBehaviour::Err => Err("device refused to free memory".into()),
            UnloadBehaviour::Panic => panic!("unload of {} exploded", self.id),
            UnloadBehaviour::Hang => std::future::pending().await,
        }
    }
}

/// The loader: sleeps for the id's delay, then fails, panics or builds a [`TestModel`].
#[derive(Clone)]
pub struct TestLoader(pub Arc<Probe>);

impl Loader<TestModel> for TestLoader {
    async fn load(&self, id: &ModelId) -> Result<TestModel, BoxError> {
        let probe = &self.0;
        *probe.loads.lock().entry(id.to_string()).or_default() += 1;
        let size = probe.size_of(id);
        probe.enter(size);
        let life = Life {
            probe: probe.clone(),
            bytes: size,
        };
        let now = probe.loading_now.fetch_add(1, Ordering::SeqCst) + 1;
        probe.max_loading.fetch_max(now, Ordering::SeqCst);
        struct Loading<'a>(&'a Probe);
        impl Drop for Loading<'_> {
            fn drop(&mut self) {
                self.0.loading_now.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _loading = Loading(probe);

        let delay = probe
            .delay
            .lock()
            .get(id.as_str())
            .copied()
            .unwrap_or(*probe.default_delay.lock());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if probe.panic.lock().contains(id.as_str()) {
            panic!("loader for {id} exploded");
        }
        if probe.fail.lock().contains(id.as_str()) {
            return Err(format!("no weights for {id}").into());
        }
        let serial = probe.next_serial.fetch_add(1, Ordering::SeqCst);
        probe.loaded_serials.lock().insert(serial);
        Ok(TestModel {
            id: id.to_string(),
            serial,
            size,
            users: AtomicUsize::new(0),
            probe: probe.clone(),
            life: Some(life),
        })
    }

    async fn probe(&self, id: &ModelId) -> Result<Option<u64>, BoxError> {
        *self.0.probes.lock().entry(id.to_string()).or_default() += 1;
        if self.0.missing.lock().contains(id.as_str()) {
            return Err(format!("model {id} does not exist").into());
        }
        let hint = self.0.hint_sizes.load(Ordering::SeqCst)
            && !self.0.unknown_size.lock().contains(id.as_str());
        Ok(hint.then(|| self.0.size_of(id)))
    }
}

/// A guard the test marks as "in use" on the model itself, so the unload hook can check that
/// nobody holds the model. The mark is taken after the guard exists and released before it drops.
pub struct Held(pub ModelGuard<TestModel>);

impl Held {
    pub fn new(guard: ModelGuard<TestModel>) -> Self {
        guard.users.fetch_add(1, Ordering::SeqCst);
        Self(guard)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.users.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Lets every runnable task run (in a paused-time test, without moving the clock).
pub async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}
