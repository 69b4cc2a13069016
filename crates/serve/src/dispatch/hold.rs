//! A streamed response keeps its replica slot until its last chunk is sent.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use modelmux_cache::BoxError;
use modelmux_context::Hold;

use crate::{Body, Response};

/// The response, holding the replica slot until its last chunk is sent when it streams.
pub(super) fn hold_until_sent(response: Response, hold: Hold) -> Response {
    match response.body().as_full() {
        Some(_) => response,
        None => response.map(|body| Body::wrap(HoldSlot { body, _hold: hold })),
    }
}

/// A streamed response body that holds its replica slot until it ends.
struct HoldSlot {
    body: Body,
    _hold: Hold,
}

impl http_body::Body for HoldSlot {
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
