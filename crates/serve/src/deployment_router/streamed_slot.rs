//! A streamed response keeps its replica slot until its last chunk is sent.

use modelmux_context::Hold;

use crate::Response;

/// The response, holding the replica slot until its last chunk is sent when it streams.
pub(super) fn hold_until_sent(response: Response, hold: Hold) -> Response {
    match response.body().as_full() {
        Some(_) => response,
        None => response.map(|body| body.holding(hold)),
    }
}
