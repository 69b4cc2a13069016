//! `modelmux-context`: which request, and which model, the code running now is serving.
//!
//! Whoever dispatches a request (the ingress, a deployment handle, a test) runs the handler
//! inside [`RequestContext::scope`]; code anywhere below it reads
//! [`multiplexed_model_id`] and [`request_id`] without having them passed down, as Ray Serve's
//! `serve.get_multiplexed_model_id()` does. Outside a request both return `None`.
//!
//! This crate owns only the task-local; it never decides ids. It must stay free of HTTP.
//!
//! ```
//! use modelmux_types::ModelId;
//! use modelmux_context::{RequestContext, RequestId, multiplexed_model_id, request_id};
//!
//! async fn handler() -> String {
//!     match multiplexed_model_id() {
//!         Some(id) => format!("serving model {id}"),
//!         None => "no model asked for".to_string(),
//!     }
//! }
//!
//! # let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
//! # rt.block_on(async {
//! let ctx = RequestContext::new()
//!     .with_request_id(RequestId::new("req-1").unwrap())
//!     .with_multiplexed_model_id(ModelId::new("42").unwrap());
//! assert_eq!(ctx.scope(handler()).await, "serving model 42");
//! assert_eq!(handler().await, "no model asked for");
//! assert!(request_id().is_none());
//! # });
//! ```
//!
//! Task-locals do not cross `tokio::spawn`: to keep the context in a spawned task, wrap its
//! future with [`RequestContext::current_or_empty`]`().scope(..)`.
//!
//! The context also carries the request's claim on its replica (a [`Hold`], set by whoever
//! dispatched the request): work a runtime starts with [`spawn_blocking`] keeps it, so a
//! replica counts the work as in progress until it really ends, even when the client that
//! asked for it has gone.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use modelmux_types::ModelId;
pub use trace::{RequestTrace, Span, SpanData, SpanSink, TraceParent, sample, span, to_hex};

mod trace;

tokio::task_local! {
    static CONTEXT: RequestContext;
}

/// The longest request id accepted, in bytes.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// An id naming one request in logs, responses (`x-request-id`) and traces.
///
/// Limited to visible ASCII so it can be echoed in a header and written in a log line as is.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(Arc<str>);

/// Why a string is not a valid [`RequestId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidRequestId {
    /// Empty.
    #[error("request id is empty")]
    Empty,
    /// Longer than [`MAX_REQUEST_ID_LEN`].
    #[error("request id is {len} bytes long; the limit is {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Has a byte outside visible ASCII (space, control, non-ASCII).
    #[error("request id has a character that is not visible ASCII at byte {index}")]
    NotVisibleAscii {
        /// Where.
        index: usize,
    },
}

impl RequestId {
    /// Validates and wraps `id`.
    pub fn new(id: impl AsRef<str>) -> Result<Self, InvalidRequestId> {
        let id = id.as_ref();
        if id.is_empty() {
            return Err(InvalidRequestId::Empty);
        }
        if id.len() > MAX_REQUEST_ID_LEN {
            return Err(InvalidRequestId::TooLong {
                len: id.len(),
                max: MAX_REQUEST_ID_LEN,
            });
        }
        if let Some(index) = id.bytes().position(|b| !b.is_ascii_graphic()) {
            return Err(InvalidRequestId::NotVisibleAscii { index });
        }
        Ok(Self(Arc::from(id)))
    }

    /// A new id, unique within this process and unpredictable across processes: 16 hex digits.
    pub fn generate() -> Self {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
            std::sync::OnceLock::new();
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        // SipHash of a counter under a random per-process key: distinct for distinct `n`.
        let mut h = SEED.get_or_init(Default::default).build_hasher();
        h.write_u64(n);
        // Written by hand: `format!` costs a formatter and a second allocation, per request.
        let bits = h.finish();
        let mut hex = [0u8; 16];
        for (i, digit) in hex.iter_mut().enumerate() {
            *digit = b"0123456789abcdef"[((bits >> (60 - 4 * i)) & 0xf) as usize];
        }
        Self(Arc::from(
            std::str::from_utf8(&hex).expect("hex digits are ASCII"),
        ))
    }

    /// The id as a string slice.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

/// What a request carries down through the code that serves it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestContext {
    request_id: Option<RequestId>,
    multiplexed_model_id: Option<ModelId>,
    hold: Option<Hold>,
    trace: Option<RequestTrace>,
}

/// A request's claim on the capacity that serves it (its replica slot): the claim ends when
/// the last clone of its `Hold` is dropped. Opaque here: the dispatcher decides what it holds.
#[derive(Clone)]
pub struct Hold(Arc<dyn std::any::Any + Send + Sync>);

impl Hold {
    /// A hold that keeps `claim` alive (and so its `Drop` from running) while any clone lives.
    pub fn new(claim: impl std::any::Any + Send + Sync) -> Self {
        Self(Arc::new(claim))
    }

    /// The claim, if it is a `T` (for the dispatcher that made it).
    pub fn claim<T: std::any::Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

/// The current request's [`Hold`], if it runs inside a request that has one.
pub fn current_hold() -> Option<Hold> {
    CONTEXT.try_with(|c| c.hold.clone()).ok().flatten()
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hold")
    }
}

impl PartialEq for Hold {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Hold {}

impl RequestContext {
    /// An empty context: no request id, no model id.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the request id.
    #[must_use]
    pub fn with_request_id(mut self, id: RequestId) -> Self {
        self.request_id = Some(id);
        self
    }

    /// Sets the multiplexed model id.
    #[must_use]
    pub fn with_multiplexed_model_id(mut self, id: ModelId) -> Self {
        self.multiplexed_model_id = Some(id);
        self
    }

    /// Sets the request's claim on its capacity, kept by work started with [`spawn_blocking`].
    #[must_use]
    pub fn with_hold(mut self, hold: Hold) -> Self {
        self.hold = Some(hold);
        self
    }

    /// Sets the request's trace (a sampled request).
    #[must_use]
    pub fn with_trace(mut self, trace: RequestTrace) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The request's trace, if it is sampled.
    pub fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_ref()
    }

    /// The request id.
    pub fn request_id(&self) -> Option<&RequestId> {
        self.request_id.as_ref()
    }

    /// The multiplexed model id.
    pub fn multiplexed_model_id(&self) -> Option<&ModelId> {
        self.multiplexed_model_id.as_ref()
    }

    /// Runs `fut` with this context as the current one. Nested scopes shadow outer ones.
    pub fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        CONTEXT.scope(self, fut)
    }

    /// Runs `f` with this context as the current one (for synchronous code).
    pub fn sync_scope<R>(self, f: impl FnOnce() -> R) -> R {
        CONTEXT.sync_scope(self, f)
    }

    /// The current context, if the caller runs inside a request; without its [`Hold`], so a
    /// task spawned with it (which may outlive the request) does not keep the request's slot.
    pub fn current() -> Option<RequestContext> {
        CONTEXT
            .try_with(|c| RequestContext {
                hold: None,
                ..c.clone()
            })
            .ok()
    }

    /// The current context, or an empty one: handy to carry the context into a spawned task.
    pub fn current_or_empty() -> RequestContext {
        Self::current().unwrap_or_default()
    }
}

/// The model id of the request being served, or `None` outside a request or when the request
/// named no model.
pub fn multiplexed_model_id() -> Option<ModelId> {
    CONTEXT
        .try_with(|c| c.multiplexed_model_id.clone())
        .ok()
        .flatten()
}

/// The trace of the request being served, if it is sampled.
pub fn current_trace() -> Option<RequestTrace> {
    CONTEXT.try_with(|c| c.trace.clone()).ok().flatten()
}

/// The id of the request being served, or `None` outside a request.
pub fn request_id() -> Option<RequestId> {
    CONTEXT.try_with(|c| c.request_id.clone()).ok().flatten()
}

/// Runs `f` on Tokio's blocking pool, keeping the current request's [`Hold`] until `f`
/// returns: the replica counts the work as in progress until it really ends, even if the
/// request is cancelled (its client gone, its timeout passed) while `f` runs. Outside a request
/// it is `tokio::task::spawn_blocking`.
pub fn spawn_blocking<F, R>(f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    let hold = current_hold();
    tokio::task::spawn_blocking(move || {
        let result = f();
        drop(hold);
        result
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(model: &str, req: &str) -> RequestContext {
        RequestContext::new()
            .with_multiplexed_model_id(ModelId::new(model).unwrap())
            .with_request_id(RequestId::new(req).unwrap())
    }

    #[tokio::test]
    async fn empty_outside_a_request() {
        assert_eq!(multiplexed_model_id(), None);
        assert_eq!(request_id(), None);
        assert_eq!(RequestContext::current(), None);
    }

    #[tokio::test]
    async fn visible_inside_and_across_awaits() {
        let seen = ctx("m1", "r1")
            .scope(async {
                tokio::task::yield_now().await;
                (
                    multiplexed_model_id().unwrap().to_string(),
                    request_id().unwrap().to_string(),
                )
            })
            .await;
        assert_eq!(seen, ("m1".to_string(), "r1".to_string()));
    }

    #[tokio::test]
    async fn concurrent_requests_do_not_see_each_other() {
        let a = ctx("a", "ra").scope(async {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            multiplexed_model_id().unwrap().to_string()
        });
        let b = ctx("b", "rb").scope(async { multiplexed_model_id().unwrap().to_string() });
        assert_eq!(tokio::join!(a, b), ("a".to_string(), "b".to_string()));
    }

    #[tokio::test]
    async fn nested_scopes_shadow_and_restore() {
        ctx("outer", "r")
            .scope(async {
                let inner = RequestContext::new()
                    .scope(async { multiplexed_model_id() })
                    .await;
                assert_eq!(
                    inner, None,
                    "a nested call does not inherit the caller's model id"
                );
                assert_eq!(multiplexed_model_id().unwrap().as_str(), "outer");
            })
            .await;
    }

    #[tokio::test]
    async fn carried_into_a_spawned_task_on_request() {
        let seen = ctx("m", "r")
            .scope(async {
                let plain = tokio::spawn(async { multiplexed_model_id() });
                let carried = tokio::spawn(
                    RequestContext::current_or_empty().scope(async { multiplexed_model_id() }),
                );
                (plain.await.unwrap(), carried.await.unwrap())
            })
            .await;
        assert_eq!(seen.0, None);
        assert_eq!(seen.1.unwrap().as_str(), "m");
    }

    #[test]
    fn request_ids_are_validated_and_generated_unique() {
        assert_eq!(RequestId::new(""), Err(InvalidRequestId::Empty));
        assert!(matches!(
            RequestId::new("a b"),
            Err(InvalidRequestId::NotVisibleAscii { index: 1 })
        ));
        assert!(matches!(
            RequestId::new("x".repeat(129)),
            Err(InvalidRequestId::TooLong { .. })
        ));
        let ids: std::collections::HashSet<_> =
            (0..10_000).map(|_| RequestId::generate()).collect();
        assert_eq!(ids.len(), 10_000);
        assert!(
            ids.iter()
                .all(|id| id.as_str().len() == 16 && RequestId::new(id.as_str()).is_ok())
        );
        // Lowercase hex, every position carrying its share of the hash's 64 bits.
        for position in 0..16 {
            let digits: std::collections::HashSet<u8> = ids
                .iter()
                .map(|id| id.as_str().as_bytes()[position])
                .collect();
            assert_eq!(digits.len(), 16, "position {position}: {digits:?}");
            assert!(
                digits
                    .iter()
                    .all(|d| d.is_ascii_digit() || (b'a'..=b'f').contains(d))
            );
        }
    }

    #[tokio::test]
    async fn blocking_work_keeps_the_hold_after_its_request_is_gone() {
        struct Claim(Arc<AtomicU64>);
        impl Drop for Claim {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let released = Arc::new(AtomicU64::new(0));
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let request = ctx("m", "r")
            .with_hold(Hold::new(Claim(released.clone())))
            .scope(async move {
                // A spawned task does not inherit the hold; blocking work does.
                let current = RequestContext::current().unwrap();
                assert_eq!(current.hold, None);
                Some(spawn_blocking(move || wait.recv().unwrap()))
            });
        let work = request.await.unwrap();
        // The request's future is done (as if cancelled): the claim lives on in the work.
        assert_eq!(released.load(Ordering::SeqCst), 0);
        go.send(()).unwrap();
        work.await.unwrap();
        assert_eq!(
            released.load(Ordering::SeqCst),
            1,
            "released when the work ended"
        );
    }

    #[test]
    fn sync_scope_works_for_blocking_code() {
        let id = ctx("s", "r").sync_scope(multiplexed_model_id);
        assert_eq!(id.unwrap().as_str(), "s");
    }
}
