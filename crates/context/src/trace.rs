//! A sampled request's trace (W3C Trace Context): its ids, carried in the request's context
//! from the ingress through queues, replicas and handles, and the spans its code finishes,
//! handed to a [`SpanSink`] (the server's exporter) as they end. A request that is not sampled
//! carries none, and every span call on it is a no-op.

use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A `traceparent` header's fields (version `00`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The caller's span.
    pub span_id: [u8; 8],
    /// Whether the caller sampled the trace.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses `00-<32 hex>-<16 hex>-<2 hex>`; `None` if it is not that (or the ids are all
    /// zero, which the specification forbids).
    pub fn parse(header: &str) -> Option<Self> {
        let mut parts = header.trim().split('-');
        let (version, trace, span, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if version.len() != 2 || version == "ff" || (version == "00" && parts.next().is_some()) {
            return None;
        }
        let trace_id: [u8; 16] = hex(trace)?;
        let span_id: [u8; 8] = hex(span)?;
        let [flags] = hex::<1>(flags)?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            span_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The header's value.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            to_hex(&self.trace_id),
            to_hex(&self.span_id),
            u8::from(self.sampled)
        )
    }
}

impl fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.header())
    }
}

fn hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N
        || !s
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Lower-case hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Random bits, unpredictable across processes (SipHash of a counter under a random key).
fn random_u64() -> u64 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    static SEED: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let mut h = SEED.get_or_init(Default::default).build_hasher();
    h.write_u64(SEQ.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// A new span id.
pub(crate) fn new_span_id() -> [u8; 8] {
    loop {
        let id = random_u64().to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// Whether a new trace is sampled at `ratio` (0 to 1).
pub fn sample(ratio: f64) -> bool {
    ratio >= 1.0 || ((random_u64() >> 11) as f64 / (1u64 << 53) as f64) < ratio
}

fn now_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A finished span.
#[derive(Clone, Debug)]
pub struct SpanData {
    /// Its trace.
    pub trace_id: [u8; 16],
    /// Its id.
    pub span_id: [u8; 8],
    /// Its parent's id (`None`: a root).
    pub parent_span_id: Option<[u8; 8]>,
    /// What it was: `ingress`, `queue_wait`, `model_load`, `inference`, `forward`, ...
    pub name: &'static str,
    /// Whether it is the server side of a call (the ingress) rather than internal work.
    pub server: bool,
    /// Start and end, Unix nanoseconds.
    pub start_unix_nanos: u64,
    /// End.
    pub end_unix_nanos: u64,
    /// Attributes (`deployment`, `replica`, `http.status_code`, ...).
    pub attributes: Vec<(&'static str, String)>,
    /// Whether it ended in an error.
    pub error: bool,
}

/// Where finished spans go (the server's exporter): called on the request's task, so it must
/// not block (queue, and export elsewhere).
pub trait SpanSink: Send + Sync + 'static {
    /// Takes a finished span.
    fn export(&self, span: SpanData);
}

/// A sampled request's trace: its id, the span everything else in this process hangs under
/// (the ingress's), and where spans go. Cloning is cheap.
#[derive(Clone)]
pub struct RequestTrace(Arc<Inner>);

struct Inner {
    trace_id: [u8; 16],
    root: [u8; 8],
    /// The caller's span (from its `traceparent`), the root's parent.
    remote_parent: Option<[u8; 8]>,
    sink: Arc<dyn SpanSink>,
}

impl RequestTrace {
    /// A trace continuing `parent` (a caller's `traceparent`), or a new one.
    pub fn new(parent: Option<TraceParent>, sink: Arc<dyn SpanSink>) -> Self {
        let trace_id = parent.map_or_else(
            || {
                let mut id = [0u8; 16];
                id[..8].copy_from_slice(&random_u64().to_be_bytes());
                id[8..].copy_from_slice(&new_span_id());
                id
            },
            |p| p.trace_id,
        );
        Self(Arc::new(Inner {
            trace_id,
            root: new_span_id(),
            remote_parent: parent.map(|p| p.span_id),
            sink,
        }))
    }

    /// The trace id.
    pub fn trace_id(&self) -> [u8; 16] {
        self.0.trace_id
    }

    /// The root span's id (this process's ingress span).
    pub fn root_span_id(&self) -> [u8; 8] {
        self.0.root
    }

    /// `traceparent` naming this process's root span: for the response, and for a request
    /// forwarded to another node (whose spans then hang under it).
    pub fn traceparent(&self) -> String {
        TraceParent {
            trace_id: self.0.trace_id,
            span_id: self.0.root,
            sampled: true,
        }
        .header()
    }

    /// Starts the root span (the ingress's): its parent is the caller's span, if any.
    pub fn start_root(&self, name: &'static str) -> Span {
        Span::start(self.clone(), name, self.0.root, self.0.remote_parent, true)
    }

    /// Starts a span under the root.
    pub fn start(&self, name: &'static str) -> Span {
        Span::start(self.clone(), name, new_span_id(), Some(self.0.root), false)
    }
}

impl fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestTrace({})", to_hex(&self.0.trace_id))
    }
}

impl PartialEq for RequestTrace {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for RequestTrace {}

/// A span in progress: [`end`](Self::end) it (dropped without ending, it is exported as it
/// is, marked an error: the work it timed was cancelled).
pub struct Span {
    trace: RequestTrace,
    data: Option<SpanData>,
}

impl Span {
    fn start(
        trace: RequestTrace,
        name: &'static str,
        span_id: [u8; 8],
        parent_span_id: Option<[u8; 8]>,
        server: bool,
    ) -> Self {
        let data = SpanData {
            trace_id: trace.0.trace_id,
            span_id,
            parent_span_id,
            name,
            server,
            start_unix_nanos: now_nanos(),
            end_unix_nanos: 0,
            attributes: Vec::new(),
            error: false,
        };
        Self {
            trace,
            data: Some(data),
        }
    }

    /// Adds an attribute.
    pub fn attribute(&mut self, key: &'static str, value: impl Into<String>) {
        if let Some(d) = &mut self.data {
            d.attributes.push((key, value.into()));
        }
    }

    /// Ends it now, an error or not.
    pub fn end(mut self, error: bool) {
        if let Some(mut d) = self.data.take() {
            d.error = error;
            d.end_unix_nanos = now_nanos();
            self.trace.0.sink.export(d);
        }
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(mut d) = self.data.take() {
            d.error = true;
            d.end_unix_nanos = now_nanos();
            d.attributes.push(("cancelled", "true".into()));
            self.trace.0.sink.export(d);
        }
    }
}

/// Starts a span under the current request's trace, if it has one (a sampled request).
pub fn span(name: &'static str) -> Option<Span> {
    crate::current_trace().map(|t| t.start(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips_and_refuses_malformed_values() {
        let value = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(value).unwrap();
        assert!(parsed.sampled);
        assert_eq!(parsed.header(), value);
        assert!(
            !TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .unwrap()
                .sampled
        );
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-xyz92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(TraceParent::parse(bad).is_none(), "{bad}");
        }
        // A later version may carry more fields.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-ab")
                .is_some()
        );
    }

    #[test]
    fn sampling_follows_the_ratio() {
        assert!((0..100).all(|_| sample(1.0)));
        let hits = (0..20_000).filter(|_| sample(0.25)).count();
        assert!((4000..6000).contains(&hits), "{hits}");
        assert_eq!((0..1000).filter(|_| sample(0.0)).count(), 0);
    }
}
