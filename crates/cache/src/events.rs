//! Per-model state changes, published the moment they happen.
//!
//! Whoever routes requests to this replica (the router's placement view), metrics and logs
//! subscribe here. Events for one id arrive in the order their changes happened, because they
//! are sent while the multiplexer's state lock is held.

use std::time::Duration;

use tokio::sync::broadcast;

use crate::{Error, ModelId};

/// One change in one model's state.
#[derive(Debug, Clone)]
pub struct ModelEvent {
    /// Sequence number, increasing by one per event of this multiplexer. A gap tells a
    /// subscriber it missed events and should resynchronise from a fresh [`Subscription`].
    pub seq: u64,
    /// The model.
    pub id: ModelId,
    /// What happened.
    pub kind: ModelEventKind,
}

/// What happened to a model.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum ModelEventKind {
    /// A load started: requests for this id should come here and will wait for it.
    Loading,
    /// The model is loaded and servable.
    Loaded {
        /// Its reported size.
        size_bytes: Option<u64>,
        /// Time spent in the loader.
        load_time: Duration,
    },
    /// The load failed; the id is not held here (any earlier `Loading` is retracted).
    Failed {
        /// Why.
        error: Error,
    },
    /// The model was evicted: no new request gets it; its unload runs when its last user is done.
    Evicting {
        /// Why it was evicted.
        reason: EvictReason,
    },
    /// The unload hook has run and the model's capacity is released.
    Unloaded {
        /// Time spent in the unload hook.
        unload_time: Duration,
        /// The hook's error or panic message, if it failed.
        error: Option<String>,
    },
}

/// Why a model was evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictReason {
    /// To make room for another model (least recently used among idle ones).
    Capacity,
    /// Someone asked for it ([`Multiplexer::evict`](crate::Multiplexer::evict)).
    Requested,
    /// The multiplexer is shutting down.
    Shutdown,
}

impl EvictReason {
    /// Its name in logs: `capacity`, `requested` or `shutdown`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Capacity => "capacity",
            Self::Requested => "requested",
            Self::Shutdown => "shutdown",
        }
    }

    /// A non-zero code that fits an atomic (0 is "not evicted").
    pub(crate) fn code(self) -> u8 {
        match self {
            Self::Capacity => 1,
            Self::Requested => 2,
            Self::Shutdown => 3,
        }
    }

    /// The reason a [`code`](Self::code) stands for.
    pub(crate) fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Capacity),
            2 => Some(Self::Requested),
            3 => Some(Self::Shutdown),
            _ => None,
        }
    }
}

/// Where a model stands, as seen in a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelStatus {
    /// A load waits for a turn (`max_concurrent_loads`) or for room under the caps: it holds
    /// no capacity yet. (Events and subscription snapshots call it `Loading`: for routing,
    /// both mean "requests for this id come here and wait".)
    Queued,
    /// A load is in progress: it holds its share of the caps.
    Loading,
    /// Loaded and servable.
    Loaded,
}

/// A consistent starting point plus every change after it: no event can fall between the two.
pub struct Subscription {
    /// The models held (loaded or loading) when the subscription was taken.
    pub snapshot: Vec<(ModelId, ModelStatus)>,
    /// The sequence number of the last event before the snapshot; events follow from `seq + 1`.
    pub seq: u64,
    /// Every event after the snapshot. If the receiver lags behind by more than the channel's
    /// capacity it gets [`broadcast::error::RecvError::Lagged`] and should subscribe again.
    pub events: broadcast::Receiver<ModelEvent>,
}
