//! The setting and costs the planner's tests start from.
#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use modelmux_cache::EvictionPolicy;
use modelmux_plan::{Costs, Setting};

/// One replica of `max_models` models, one load at a time, LRU, 8 requests at once.
pub fn one_replica(max_models: usize) -> Setting {
    Setting {
        replicas: 1,
        max_models: Some(max_models),
        max_bytes: None,
        max_concurrent_loads: 1,
        eviction: EvictionPolicy::Lru,
        max_ongoing_requests: Some(8),
        max_queued_requests: None,
        queue_timeout: None,
    }
}

/// Loads of 100 ms, requests of 10 ms.
pub fn costs() -> Costs {
    Costs {
        load: Duration::from_millis(100),
        service: Duration::from_millis(10),
        size_bytes: None,
    }
}
