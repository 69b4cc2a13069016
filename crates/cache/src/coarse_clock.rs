//! The coarse clock the cache and the router read where precision does not matter (when a
//! model became idle, when a replica's model was last routed to): a plain memory read
//! (`CLOCK_MONOTONIC_COARSE`, a few milliseconds' resolution) rather than a precise clock read,
//! which costs about as much as the rest of a cache hit.
//!
//! A process that replays traffic in virtual time (`modelmux plan`, under Tokio's paused clock)
//! calls [`follow_tokio_time`] once, first: the coarse clock then reads Tokio's clock, so idle
//! times and routing recency advance with the virtual time as they would with the real one.
//! A server never calls it, and pays one relaxed load per read for the choice.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static VIRTUAL: AtomicBool = AtomicBool::new(false);
static BASE: OnceLock<tokio::time::Instant> = OnceLock::new();

/// Ticks per second: coarsetime's fixed point, 32 bits of fraction.
const TICKS_PER_SECOND: u128 = 1 << 32;

/// From now on, the coarse clock reads Tokio's clock (paused and advanced by a replay). For a
/// process that replays a trace; irreversible.
pub fn follow_tokio_time() {
    BASE.get_or_init(tokio::time::Instant::now);
    VIRTUAL.store(true, Ordering::Release);
}

/// Now, in ticks (only differences between two readings mean anything).
pub fn ticks() -> u64 {
    if VIRTUAL.load(Ordering::Relaxed) {
        let base = *BASE.get().expect("set before VIRTUAL");
        let since = tokio::time::Instant::now().saturating_duration_since(base);
        (since.as_nanos() * TICKS_PER_SECOND / 1_000_000_000) as u64
    } else {
        coarsetime::Instant::now().as_ticks()
    }
}

/// The time since `ticks` (a reading of [`ticks`]); zero for a reading from the future.
pub fn since(ticks: u64) -> Duration {
    let now = self::ticks();
    let elapsed = u128::from(now.saturating_sub(ticks));
    Duration::from_nanos((elapsed * 1_000_000_000 / TICKS_PER_SECOND) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_ticks_are_coarsetimes() {
        // (The virtual mode is process-wide: it is tested by the planner's own binary.)
        let before = ticks();
        std::thread::sleep(Duration::from_millis(30));
        let took = since(before);
        assert!(
            took >= Duration::from_millis(15) && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}
