//! How downloads are retried: a bounded number of attempts, each bounded in time as a whole
//! (connect, headers and every byte of the body), with exponential backoff and full jitter
//! between them. Only transient failures are retried.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// Retry and timeout settings for downloads from a remote repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Longest one attempt may take, from the request to the last byte written. A server that
    /// stalls in the middle of a body is cut off by this, not only one that never answers.
    pub attempt_timeout: Duration,
    /// Backoff before the second attempt; it doubles for each further one.
    pub backoff_base: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 4,
            attempt_timeout: Duration::from_secs(600),
            backoff_base: Duration::from_millis(200),
            backoff_max: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The pause before attempt `next` (2 for the first retry): uniformly random between zero
    /// and `min(backoff_max, backoff_base × 2^(next-2))` ("full jitter"), so replicas that
    /// failed together do not retry together.
    pub fn backoff(&self, next: u32) -> Duration {
        let exp = next.saturating_sub(2).min(30);
        let ceiling = self
            .backoff_base
            .saturating_mul(1u32 << exp)
            .min(self.backoff_max);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(random() % (nanos + 1))
    }
}

/// A random number from the standard library's per-process random hash keys; good enough for
/// jitter, and no dependency.
pub(crate) fn random() -> u64 {
    let mut hasher = std::hash::RandomState::new().build_hasher();
    hasher.write_u64(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
    );
    hasher.finish()
}

/// Whether a failed attempt is worth another: the object is missing or access is denied
/// (no retry), or something transient went wrong (retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    NotFound,
    Denied,
    /// 5xx, 429, timeouts, resets: worth another attempt.
    Transient,
    /// Anything else (an invalid path, an unsupported operation, ...): another attempt would
    /// fail the same way.
    Permanent,
}

pub(crate) fn classify(error: &object_store::Error) -> Failure {
    use object_store::Error as E;
    match error {
        E::NotFound { .. } => Failure::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => Failure::Denied,
        // A redirect off the repository's origin is refused again on every attempt.
        E::Generic { .. } if crate::client::refused_redirect(error).is_some() => Failure::Permanent,
        // Generic is how object_store reports HTTP and network failures once its own (here
        // disabled) retries are done: server errors, throttling, timeouts, resets.
        E::Generic { .. } | E::JoinError { .. } => Failure::Transient,
        _ => Failure::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_bounded_and_grows() {
        let policy = RetryPolicy {
            attempts: 10,
            attempt_timeout: Duration::from_secs(1),
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_millis(700),
        };
        for _ in 0..1000 {
            assert!(policy.backoff(2) <= Duration::from_millis(100));
            assert!(policy.backoff(3) <= Duration::from_millis(200));
            assert!(policy.backoff(4) <= Duration::from_millis(400));
            assert!(policy.backoff(9) <= Duration::from_millis(700));
            assert!(policy.backoff(u32::MAX) <= Duration::from_millis(700));
        }
        // Jittered: not always the same value.
        let samples: std::collections::HashSet<_> = (0..50).map(|_| policy.backoff(5)).collect();
        assert!(samples.len() > 10, "{samples:?}");
        // Spread over the whole range, not stuck near zero.
        assert!((0..200).any(|_| policy.backoff(5) > Duration::from_millis(500)));
    }

    #[test]
    fn not_found_and_denied_are_not_transient() {
        let nf = object_store::Error::NotFound {
            path: "a".into(),
            source: "gone".into(),
        };
        assert_eq!(classify(&nf), Failure::NotFound);
        let denied = object_store::Error::PermissionDenied {
            path: "a".into(),
            source: "403".into(),
        };
        assert_eq!(classify(&denied), Failure::Denied);
        let generic = object_store::Error::Generic {
            store: "S3",
            source: "503 Slow Down".into(),
        };
        assert_eq!(classify(&generic), Failure::Transient);
        let unsupported = object_store::Error::NotSupported {
            source: "no".into(),
        };
        assert_eq!(classify(&unsupported), Failure::Permanent);
    }
}
