//! Sending a request again: to another node when forwarding failed, or to another replica of
//! this node when its replica stopped under it (a Python worker that died) and the deployment
//! is `idempotent`.

use modelmux_cache::ErrorKind;

use crate::dispatch::Dispatched;
use crate::{Body, HandleCall, Request, ServeError};

/// A copy of a request whose body is in memory (for sending it elsewhere), if it is.
pub(super) fn copy_request(request: &Request) -> Option<Request> {
    let body = request.body().full_bytes()?;
    let mut copy = http::Request::new(Body::from(body));
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    if let Some(call) = request.extensions().get::<HandleCall>() {
        copy.extensions_mut().insert(call.clone());
    }
    Some(copy)
}

/// How one attempt (forwarded to another node, or run on a replica of this one) ended.
pub(super) enum Attempted {
    Done(Dispatched),
    /// Not served there, and safe to send elsewhere: the copy to send.
    Retry(Request),
}

/// Whether a local call ended with `error` because its replica stopped under it
/// (`Unavailable`: the replica, or its worker process, went away): the work may or may not
/// have run, so only an idempotent deployment's call runs again, routed afresh (the
/// replica's models left the router's view with it).
pub(super) fn replica_stopped(error: &ServeError) -> bool {
    matches!(error, ServeError::Failed(f) if f.kind() == ErrorKind::Unavailable)
}
