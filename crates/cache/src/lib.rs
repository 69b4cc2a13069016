//! `modelmux-cache`: the per-replica model cache of modelmux.
//!
//! A [`Multiplexer<M>`] holds the models one replica serves, loading them on demand with a
//! [`Loader`] you supply and evicting the least recently used idle ones when its caps (a count
//! and, optionally, bytes) are reached. It is what Ray Serve's `serve.multiplexed` is, with the
//! problems its users hit designed out:
//!
//! | Ray Serve's multiplexing | here |
//! |---|---|
//! | one replica-wide lock around every load and unload | single flight per id; different ids load in parallel (bounded) |
//! | evicts the LRU model even while requests use it | [`ModelGuard`] pins; unload runs after the last guard drops, exactly once |
//! | evicts before loading, so a failed load still costs a model | room is made only once a load has a reservation; failures release it |
//! | failures are not remembered | failures are remembered with an exponential backoff |
//! | count cap only | count cap and byte cap, counting loading and draining models |
//! | state pushed every 100 ms; failed loads stay advertised | [`subscribe`](Multiplexer::subscribe): every change, the moment it happens |
//! | no preload, pin, list or evict | [`preload`](Multiplexer::preload), [`pin`](Multiplexer::pin), [`models`](Multiplexer::models), [`evict`](Multiplexer::evict) |
//!
//! This crate has no HTTP and no ML dependency: it is plain async Rust on Tokio.
//!
//! ```
//! use modelmux_cache::{BoxError, Model, ModelId, Multiplexer};
//!
//! struct Weights(Vec<f32>);
//!
//! impl Model for Weights {
//!     fn size_bytes(&self) -> Option<u64> {
//!         Some(4 * self.0.len() as u64)
//!     }
//! }
//!
//! async fn load(id: ModelId) -> Result<Weights, BoxError> {
//!     let seed: f32 = id.parse()?;
//!     Ok(Weights(vec![seed; 1024]))
//! }
//!
//! # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
//! # rt.block_on(async {
//! let models = Multiplexer::builder().max_models(2).max_bytes(1 << 20).build(load);
//! let m = models.get("7").await?;
//! assert_eq!(m.0[0], 7.0);
//! assert!(models.get("not-a-number").await.is_err());
//! # Ok::<_, modelmux_cache::Error>(())
//! # }).unwrap();
//! ```

pub mod coarse_clock;
mod core;
mod error;
mod events;
mod eviction;
mod expiring;
mod guard;
mod index;
mod load;
mod metrics;
mod model;
mod multiplexer;

pub use error::{Error, SharedError, panic_message};
pub use events::{EvictReason, ModelEvent, ModelEventKind, ModelStatus, Subscription};
pub use expiring::ExpiringMap;
pub use guard::ModelGuard;
pub use metrics::{
    DURATION_BUCKETS, DurationHistogram, Gauges, HistogramSnapshot, MetricsSnapshot,
};
pub use model::{BoxError, Loader, Model};
pub use modelmux_types::{ErrorKind, Failure, InvalidModelId, MAX_MODEL_ID_LEN, ModelId};
pub use multiplexer::{
    Config, EvictionPolicy, ModelInfo, Multiplexer, MultiplexerBuilder, ShutdownReport,
};
