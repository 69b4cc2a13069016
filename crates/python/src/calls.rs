//! Handle calls a worker makes, on the wire: their arguments arrive in one `CALL` frame or in
//! chunks (`CALL`, `CALL_BODY`*, `CALL_END`), so a pickle of any size up to
//! [`MAX_CALL_ARGS`](wire::MAX_CALL_ARGS) goes through; their results go back as they arrive
//! from the callee (`CALL_RESULT`, then `CALL_RESULT_BODY`* and `CALL_RESULT_END` when there is
//! more than one chunk), so a large result is never held whole here and a `stream=True`
//! generator's items reach the caller while the callee still runs. A `CALL_CANCEL` (the caller
//! stopped waiting, or dropped a stream) aborts the call, which drops the callee's response and
//! so cancels its request.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use modelmux_serve::Body;
use tokio::task::AbortHandle;

use crate::wire::{self, CallEndHead, CallError, CallHead, CallResultHead, ToWorker};

/// What a handle call came back with: the result's head and its body (streamed on).
pub(crate) struct CallAnswer {
    pub(crate) head: CallResultHead,
    pub(crate) body: Body,
}

impl CallAnswer {
    /// An answer with no body.
    pub(crate) fn failed(error: CallError) -> Self {
        Self {
            head: CallResultHead::failed(error),
            body: Body::from(Bytes::new()),
        }
    }
}

/// A call whose arguments are still arriving.
struct Assembling {
    head: CallHead,
    args: BytesMut,
}

/// The calls of one connection in progress: arguments being assembled, and calls running.
#[derive(Default)]
pub(crate) struct Calls {
    assembling: HashMap<u32, Assembling>,
    running: HashMap<u32, AbortHandle>,
}

/// What a `CALL` or `CALL_BODY` frame leads to.
pub(crate) enum Arrived {
    /// The arguments are complete: run the call.
    Ready(CallHead, Bytes),
    /// More frames are to come.
    Waiting,
    /// The arguments passed the limit: answer this failure (the call's later frames are
    /// ignored).
    TooLarge(CallError),
}

impl Calls {
    /// A `CALL` frame on `stream`.
    pub(crate) fn start(&mut self, stream: u32, head: CallHead, first: Bytes) -> Arrived {
        if !head.more {
            return Arrived::Ready(head, first);
        }
        let mut args = BytesMut::with_capacity(first.len().max(wire::CHUNK));
        args.extend_from_slice(&first);
        self.assembling.insert(stream, Assembling { head, args });
        self.check(stream)
    }

    /// A `CALL_BODY` frame: more of the arguments.
    pub(crate) fn body(&mut self, stream: u32, chunk: &[u8]) -> Arrived {
        match self.assembling.get_mut(&stream) {
            Some(call) => {
                call.args.extend_from_slice(chunk);
                self.check(stream)
            }
            None => Arrived::Waiting,
        }
    }

    /// A `CALL_END` frame: the arguments are complete.
    pub(crate) fn end(&mut self, stream: u32) -> Option<(CallHead, Bytes)> {
        let call = self.assembling.remove(&stream)?;
        Some((call.head, call.args.freeze()))
    }

    fn check(&mut self, stream: u32) -> Arrived {
        let len = self.assembling.get(&stream).map_or(0, |c| c.args.len());
        if len <= wire::MAX_CALL_ARGS {
            return Arrived::Waiting;
        }
        self.assembling.remove(&stream);
        Arrived::TooLarge(CallError::new(
            "ValueError",
            format!(
                "a handle call's arguments are over {} MiB pickled",
                wire::MAX_CALL_ARGS >> 20
            ),
            413,
        ))
    }

    /// Notes a running call, to abort on `CALL_CANCEL`.
    pub(crate) fn running(&mut self, stream: u32, task: AbortHandle) {
        self.running.insert(stream, task);
    }

    /// The call on `stream` has ended (answered or cancelled).
    pub(crate) fn done(&mut self, stream: u32) -> Option<AbortHandle> {
        self.assembling.remove(&stream);
        self.running.remove(&stream)
    }

    /// Aborts every running call: the connection is gone.
    pub(crate) fn abort_all(&mut self) {
        self.assembling.clear();
        for (_, task) in self.running.drain() {
            task.abort();
        }
    }
}

/// Sends `answer` to the worker as the result of the call on `stream`, through `send` (one
/// encoded frame at a time): one `CALL_RESULT` when its body is in memory and fits in a chunk,
/// else a `CALL_RESULT` with `more`, the body's chunks as they come, and a `CALL_RESULT_END`
/// (with the error, if reading the body failed midway).
pub(crate) async fn relay(stream: u32, answer: CallAnswer, send: impl Fn(Bytes)) {
    let CallAnswer { mut head, body } = answer;
    if let Some(full) = body.full_bytes().filter(|b| b.len() <= wire::CHUNK) {
        send(wire::encode(
            ToWorker::CallResult,
            stream,
            Some(&head),
            &full,
        ));
        return;
    }
    head.more = true;
    send(wire::encode(ToWorker::CallResult, stream, Some(&head), b""));
    let mut body = body;
    let mut end = CallEndHead { error: None };
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(frame) => {
                let Ok(data) = frame.into_data() else {
                    continue; // trailers: not part of a call's result
                };
                for part in data.chunks(wire::CHUNK) {
                    send(wire::encode(
                        ToWorker::CallResultBody,
                        stream,
                        None::<&()>,
                        part,
                    ));
                }
            }
            Err(e) => {
                end.error = Some(CallError::new(
                    "DeploymentResponseError",
                    format!("the callee's answer was cut off: {e}"),
                    502,
                ));
                break;
            }
        }
    }
    send(wire::encode(
        ToWorker::CallResultEnd,
        stream,
        Some(&end),
        b"",
    ));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(more: bool) -> CallHead {
        serde_json::from_value(serde_json::json!({"deployment": "D", "more": more})).unwrap()
    }

    #[test]
    fn arguments_in_chunks_are_assembled_in_order() {
        let mut calls = Calls::default();
        assert!(matches!(
            calls.start(3, head(true), Bytes::from_static(b"ab")),
            Arrived::Waiting
        ));
        assert!(matches!(calls.body(3, b"cd"), Arrived::Waiting));
        assert!(matches!(calls.body(4, b"not ours"), Arrived::Waiting));
        let (head, args) = calls.end(3).unwrap();
        assert_eq!((head.deployment.as_str(), &args[..]), ("D", &b"abcd"[..]));
        assert!(calls.end(3).is_none(), "a call ends once");
        let one = calls.start(5, head_one(), Bytes::from_static(b"x"));
        assert!(matches!(one, Arrived::Ready(_, ref a) if &a[..] == b"x"));
    }

    fn head_one() -> CallHead {
        head(false)
    }

    #[test]
    fn arguments_over_the_limit_are_refused_and_forgotten() {
        let mut calls = Calls::default();
        let first = Bytes::from(vec![0u8; wire::CHUNK]);
        assert!(matches!(
            calls.start(1, head(true), first),
            Arrived::Waiting
        ));
        let chunk = vec![0u8; wire::CHUNK];
        let mut refused = None;
        for _ in 0..(wire::MAX_CALL_ARGS / wire::CHUNK) {
            if let Arrived::TooLarge(e) = calls.body(1, &chunk) {
                refused = Some(e);
                break;
            }
        }
        let error = refused.expect("over the limit, the call is refused");
        assert_eq!((error.kind.as_str(), error.status), ("ValueError", 413));
        assert!(error.message.contains("512 MiB"), "{}", error.message);
        assert!(calls.end(1).is_none(), "its END finds nothing");
    }

    #[tokio::test]
    async fn a_large_result_goes_back_in_chunks_and_a_small_one_in_one_frame() {
        let sent = parking_lot::Mutex::new(Vec::new());
        let record = |frame: Bytes| sent.lock().push(frame);
        let small = CallAnswer {
            head: CallResultHead::answered(200, false),
            body: Body::from(Bytes::from_static(b"tiny")),
        };
        relay(9, small, record).await;
        let big = vec![7u8; 2 * wire::CHUNK + 5];
        let large = CallAnswer {
            head: CallResultHead::answered(200, false),
            body: Body::from(Bytes::from(big.clone())),
        };
        relay(10, large, record).await;
        let frames = sent.into_inner();
        let types: Vec<u8> = frames.iter().map(|f| f[4]).collect();
        // One CALL_RESULT; then CALL_RESULT (more), three bodies, CALL_RESULT_END.
        assert_eq!(types, [7, 7, 8, 8, 8, 9]);
        let body: Vec<u8> = frames[2..5].iter().flat_map(|f| f[13..].to_vec()).collect();
        assert_eq!(body, big);
        let head: serde_json::Value = serde_json::from_slice(&frames[1][13..]).unwrap();
        assert_eq!(head["more"], true);
    }
}
