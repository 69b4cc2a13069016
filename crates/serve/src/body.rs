//! The body type requests and responses carry: a full buffer (the common case, no boxing), a
//! channel (for streaming responses such as server-sent events), or any boxed `http_body::Body`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use modelmux_cache::BoxError;
use tokio::sync::mpsc;

/// A request or response body.
///
/// ```
/// use modelmux_serve::Body;
///
/// let body = Body::from("hello");
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// assert_eq!(body.to_bytes(1024).await.unwrap(), "hello");
/// # });
/// ```
pub struct Body {
    kind: Kind,
}

enum Kind {
    Full(Option<Bytes>),
    Channel(mpsc::Receiver<Result<Bytes, BoxError>>),
    Boxed(Pin<Box<dyn http_body::Body<Data = Bytes, Error = BoxError> + Send + Sync>>),
}

/// The sending half of [`Body::channel`]: each `send` becomes one chunk of the response.
#[derive(Clone)]
pub struct BodySender {
    tx: mpsc::Sender<Result<Bytes, BoxError>>,
}

impl BodySender {
    /// Sends a chunk, waiting while the client is slower than the producer (the channel is
    /// bounded, so a slow client cannot make the server buffer without limit). Fails when the
    /// client has gone away.
    pub async fn send(&self, chunk: impl Into<Bytes>) -> Result<(), BoxError> {
        self.tx
            .send(Ok(chunk.into()))
            .await
            .map_err(|_| "the client went away".into())
    }

    /// Completes when the body's reader has gone (the client left, or the caller dropped the
    /// response): a producer waiting for something else to send learns it now, not at its
    /// next send.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }

    /// Ends the body with an error (the connection is closed without a proper end).
    pub async fn abort(self, error: impl Into<BoxError>) {
        let _ = self.tx.send(Err(error.into())).await;
    }
}

/// Why a body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// Longer than allowed.
    #[error("body is larger than the limit of {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: usize,
    },
    /// The stream failed.
    #[error("reading the body failed: {0}")]
    Read(BoxError),
}

impl Body {
    /// An empty body.
    pub fn empty() -> Self {
        Self {
            kind: Kind::Full(None),
        }
    }

    /// A streaming body and the sender that feeds it. At most `buffer` chunks wait unsent.
    pub fn channel(buffer: usize) -> (BodySender, Body) {
        let (tx, rx) = mpsc::channel(buffer.max(1));
        (
            BodySender { tx },
            Body {
                kind: Kind::Channel(rx),
            },
        )
    }

    /// Wraps any body.
    pub fn wrap<B>(body: B) -> Self
    where
        B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
        B::Error: Into<BoxError>,
    {
        Self {
            kind: Kind::Boxed(Box::pin(body.map_err(Into::into))),
        }
    }

    /// This body, keeping `guard` alive until the body has been read to its end or dropped:
    /// what a streamed response holds while it is sent (its replica slot, its place among a
    /// connection's streams in progress).
    pub fn holding<G: Send + Sync + Unpin + 'static>(self, guard: G) -> Self {
        Self::wrap(Holding {
            body: self,
            _guard: guard,
        })
    }

    /// Serialises `value` as JSON.
    pub fn json<T: serde::Serialize + ?Sized>(value: &T) -> Self {
        match serde_json::to_vec(value) {
            Ok(v) => Self::from(v),
            // Serialising our own response types cannot fail; say so rather than panic.
            Err(e) => Self::from(format!(
                "{{\"error\":\"serialising the response failed: {e}\"}}"
            )),
        }
    }

    /// Reads the whole body, failing if it is longer than `limit` bytes.
    pub async fn to_bytes(self, limit: usize) -> Result<Bytes, BodyError> {
        if let Kind::Full(bytes) = self.kind {
            let bytes = bytes.unwrap_or_default();
            return if bytes.len() > limit {
                Err(BodyError::TooLarge { limit })
            } else {
                Ok(bytes)
            };
        }
        let limited = http_body_util::Limited::new(self, limit);
        match limited.collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(BodyError::TooLarge { limit })
            }
            Err(e) => Err(BodyError::Read(e)),
        }
    }

    /// A copy of the whole body if it is already in memory (sharing its bytes).
    pub fn full_bytes(&self) -> Option<Bytes> {
        match &self.kind {
            Kind::Full(b) => Some(b.clone().unwrap_or_default()),
            _ => None,
        }
    }

    /// The whole body if it is already in memory.
    pub fn as_full(&self) -> Option<&[u8]> {
        match &self.kind {
            Kind::Full(b) => Some(b.as_deref().unwrap_or_default()),
            _ => None,
        }
    }
}

impl Default for Body {
    fn default() -> Self {
        Self::empty()
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Self {
            kind: Kind::Full(Some(b)),
        }
    }
}

impl From<Vec<u8>> for Body {
    fn from(v: Vec<u8>) -> Self {
        Bytes::from(v).into()
    }
}

impl From<String> for Body {
    fn from(s: String) -> Self {
        Bytes::from(s).into()
    }
}

impl From<&'static str> for Body {
    fn from(s: &'static str) -> Self {
        Bytes::from_static(s.as_bytes()).into()
    }
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Full(b) => Poll::Ready(
                b.take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Kind::Channel(rx) => rx
                .poll_recv(cx)
                .map(|chunk| chunk.map(|r| r.map(Frame::data))),
            Kind::Boxed(body) => body.as_mut().poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full(b) => b.as_ref().is_none_or(Bytes::is_empty),
            Kind::Channel(_) => false,
            Kind::Boxed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Channel(_) => SizeHint::default(),
            Kind::Boxed(body) => body.size_hint(),
        }
    }
}

/// A body and what it holds until it ends ([`Body::holding`]).
struct Holding<G> {
    body: Body,
    _guard: G,
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Full(b) => write!(f, "Body({} bytes)", b.as_ref().map_or(0, Bytes::len)),
            Kind::Channel(_) => f.write_str("Body(stream)"),
            Kind::Boxed(_) => f.write_str("Body(boxed)"),
        }
    }
}

/// A `200` response with `value` as its JSON body and `Content-Type: application/json`.
pub fn json_response<T: serde::Serialize + ?Sized>(value: &T) -> crate::Response {
    let mut response = crate::Response::new(Body::json(value));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// Whether `headers` carry `Authorization: Bearer <token>` (the scheme in any case). The
/// comparison takes a time that depends only on the length of what was sent: not on where it
/// differs from `token`, nor on `token`'s length. An empty `token` matches nothing.
pub(crate) fn bearer_token_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let given = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim());
    given.is_some_and(|g| same_secret(g.as_bytes(), token.as_bytes()))
}

/// Whether `given` is `secret`, looking at every byte of `given` whatever it holds.
pub(crate) fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    if secret.is_empty() {
        return false;
    }
    let mut diff = given.len() ^ secret.len();
    for (i, &g) in given.iter().enumerate() {
        diff |= usize::from(g ^ secret[i % secret.len()]);
        // Keeps the compiler from ending the loop once `diff` is known to be non-zero.
        diff = std::hint::black_box(diff);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_match_only_whole() {
        let with = |value: &str| {
            let mut headers = http::HeaderMap::new();
            headers.insert(http::header::AUTHORIZATION, value.parse().unwrap());
            headers
        };
        assert!(bearer_token_matches(&with("Bearer s3cret"), "s3cret"));
        assert!(bearer_token_matches(&with("bearer s3cret"), "s3cret"));
        for wrong in [
            "Bearer s3cre",
            "Bearer s3crett",
            "Bearer s3cres",
            "Basic s3cret",
            "s3cret",
        ] {
            assert!(!bearer_token_matches(&with(wrong), "s3cret"), "{wrong}");
        }
        // A repeated token is not the token (the comparison wraps around the secret).
        assert!(!bearer_token_matches(&with("Bearer abab"), "ab"));
        assert!(!bearer_token_matches(&http::HeaderMap::new(), "s3cret"));
        assert!(!bearer_token_matches(&with("Bearer x"), ""));
    }

    #[tokio::test]
    async fn full_bodies_respect_the_limit() {
        assert_eq!(Body::from("abc").to_bytes(3).await.unwrap(), "abc");
        assert!(matches!(
            Body::from("abcd").to_bytes(3).await,
            Err(BodyError::TooLarge { limit: 3 })
        ));
        assert_eq!(Body::empty().to_bytes(0).await.unwrap(), "");
    }

    #[tokio::test]
    async fn channel_bodies_stream_and_respect_the_limit() {
        let (tx, body) = Body::channel(2);
        tokio::spawn(async move {
            for chunk in ["a", "b", "c"] {
                tx.send(chunk).await.unwrap();
            }
        });
        assert_eq!(body.to_bytes(10).await.unwrap(), "abc");

        let (tx, body) = Body::channel(2);
        tokio::spawn(async move { while tx.send("xxxx").await.is_ok() {} });
        assert!(matches!(
            body.to_bytes(10).await,
            Err(BodyError::TooLarge { limit: 10 })
        ));
    }
}
