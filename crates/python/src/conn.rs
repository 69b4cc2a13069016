//! One connection to a worker: a writer task that coalesces frames into few writes, a reader
//! task that hands each frame to the stream it belongs to, and the streams themselves
//! (requests in flight, control orders waiting for their reply). Calls the worker starts
//! (handle calls, ensemble loads) go to [`Callbacks`]; handle calls' frames are in `calls.rs`.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot, watch};

use crate::calls::{self, Arrived, CallAnswer, Calls};
use crate::wire::{
    self, AcquireHead, CallHead, CallResultHead, Frame, FromWorker, PyError, ReplyHead, StartHead,
    ToWorker, WireError,
};

/// A boxed future, for the object-safe [`Callbacks`].
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a response stream receives.
#[derive(Debug)]
pub(crate) enum Event {
    /// The response's status and headers, with its first bytes; `more` says whether body
    /// frames follow.
    Start(StartHead, Bytes),
    /// A chunk of the body.
    Body(Bytes),
    /// The body is complete.
    End,
    /// The user's code raised.
    Error(PyError),
    /// The worker went away (the message says how).
    Gone(String),
}

/// Work the worker asks of modelmux.
pub(crate) trait Callbacks: Send + Sync + 'static {
    /// A handle call to another deployment: the result's head and body (streamed on as it
    /// arrives).
    fn call(&self, head: CallHead, args: Bytes) -> BoxFuture<'_, CallAnswer>;

    /// Gets `model_id` through the replica's cache for the request in flight; what is
    /// returned keeps the model loaded until it is dropped (with the request).
    fn acquire(
        &self,
        model_id: String,
    ) -> BoxFuture<'_, Result<Box<dyn Send + Sync>, wire::CallError>>;
}

struct RequestEntry {
    events: mpsc::UnboundedSender<Event>,
    /// Models an ensemble acquired for this request, held until it ends.
    held: Vec<Box<dyn Send + Sync>>,
}

#[derive(Default)]
struct Streams {
    requests: HashMap<u32, RequestEntry>,
    controls: HashMap<u32, oneshot::Sender<Result<ReplyHead, String>>>,
    /// Handle calls the worker made.
    calls: Calls,
    /// Why the connection ended, once it has.
    closed: Option<String>,
}

/// A live connection to one worker process.
pub(crate) struct Conn {
    writes: mpsc::UnboundedSender<Bytes>,
    streams: Mutex<Streams>,
    next_stream: AtomicU32,
    closed: watch::Sender<bool>,
    /// Run once when the connection ends, before any stream learns of it.
    on_end: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Conn {
    /// Takes over `socket` (the worker has sent `READY` on it, already read): starts the
    /// reader and writer tasks.
    pub(crate) fn start(
        reader: OwnedReadHalf,
        writer: OwnedWriteHalf,
        callbacks: Arc<dyn Callbacks>,
    ) -> Arc<Conn> {
        let (writes, queue) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            writes,
            streams: Mutex::new(Streams::default()),
            next_stream: AtomicU32::new(1),
            closed: watch::channel(false).0,
            on_end: Mutex::new(None),
        });
        tokio::spawn(write_loop(queue, writer));
        tokio::spawn(read_loop(conn.clone(), reader, callbacks));
        conn
    }

    /// Splits a connected socket for [`start`](Self::start).
    pub(crate) fn split(socket: UnixStream) -> (OwnedReadHalf, OwnedWriteHalf) {
        socket.into_split()
    }

    fn next_id(&self) -> u32 {
        self.next_stream.fetch_add(1, Ordering::Relaxed)
    }

    fn send(&self, frame: Bytes) {
        // A closed writer means the connection is ending; the reader fails every stream.
        let _ = self.writes.send(frame);
    }

    /// Resolves once the connection has ended.
    pub(crate) async fn closed(&self) {
        let mut rx = self.closed.subscribe();
        let _ = rx.wait_for(|closed| *closed).await;
    }

    /// Why the connection ended, if it has.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.streams.lock().closed.clone()
    }

    /// Sends a control order and waits for its reply.
    pub(crate) async fn control(&self, op: &impl Serialize) -> Result<ReplyHead, String> {
        let id = self.next_id();
        let (tx, rx) = oneshot::channel();
        {
            let mut streams = self.streams.lock();
            if let Some(reason) = &streams.closed {
                return Err(reason.clone());
            }
            streams.controls.insert(id, tx);
        }
        self.send(wire::encode(ToWorker::Control, id, Some(op), b""));
        match rx.await {
            Ok(reply) => reply,
            Err(_) => Err("the worker's connection ended".into()),
        }
    }

    /// Opens a request stream: sends its head and the first (or only) part of its body.
    pub(crate) fn open_request(
        self: &Arc<Self>,
        head: &wire::RequestHead<'_>,
        first: &[u8],
    ) -> Result<RequestStream, String> {
        let id = self.next_id();
        // Unbounded: what one stream holds is bounded by its window (`RESPONSE_WINDOW`), which
        // the worker keeps; the read loop never waits for one stream's reader.
        let (tx, rx) = mpsc::unbounded_channel();
        {
            let mut streams = self.streams.lock();
            if let Some(reason) = &streams.closed {
                return Err(reason.clone());
            }
            streams.requests.insert(
                id,
                RequestEntry {
                    events: tx,
                    held: Vec::new(),
                },
            );
        }
        self.send(wire::encode(ToWorker::Request, id, Some(head), first));
        Ok(RequestStream {
            conn: self.clone(),
            id,
            events: rx,
            finished: false,
            uncredited: 0,
        })
    }

    fn finish_request(&self, id: u32, cancel: bool) {
        let entry = self.streams.lock().requests.remove(&id);
        if cancel && entry.is_some() {
            self.send(wire::encode(ToWorker::Cancel, id, None::<&()>, b""));
        }
    }

    /// Has `f` run when the connection ends, before its streams fail: whoever sees a request
    /// fail then also sees what `f` changed (the supervisor evicts the worker's models, so no
    /// router still lists them by the time their requests have failed).
    pub(crate) fn on_end(&self, f: impl FnOnce() + Send + 'static) {
        *self.on_end.lock() = Some(Box::new(f));
    }

    /// Ends every stream with `reason` and refuses new ones; the worker is gone.
    pub(crate) fn fail_all(&self, reason: &str) {
        let on_end = self.on_end.lock().take();
        if let Some(on_end) = on_end {
            on_end();
        }
        let (requests, controls) = {
            let mut streams = self.streams.lock();
            if streams.closed.is_none() {
                streams.closed = Some(reason.to_string());
            }
            streams.calls.abort_all();
            (
                std::mem::take(&mut streams.requests),
                std::mem::take(&mut streams.controls),
            )
        };
        for (_, entry) in requests {
            let _ = entry.events.send(Event::Gone(reason.to_string()));
        }
        for (_, reply) in controls {
            let _ = reply.send(Err(reason.to_string()));
        }
        self.closed.send_replace(true);
    }

    async fn route(
        self: &Arc<Self>,
        frame: Frame,
        callbacks: &Arc<dyn Callbacks>,
    ) -> Result<(), WireError> {
        let event = match frame.ty {
            FromWorker::Start => Event::Start(frame.head()?, frame.data),
            FromWorker::Body => Event::Body(frame.data),
            FromWorker::End => Event::End,
            FromWorker::Error => Event::Error(frame.head()?),
            FromWorker::Reply => {
                let reply: ReplyHead = frame.head()?;
                if let Some(tx) = self.streams.lock().controls.remove(&frame.stream) {
                    let _ = tx.send(Ok(reply));
                }
                return Ok(());
            }
            FromWorker::Call => {
                let head: CallHead = frame.head()?;
                let arrived = self
                    .streams
                    .lock()
                    .calls
                    .start(frame.stream, head, frame.data);
                self.arrived(frame.stream, arrived, callbacks);
                return Ok(());
            }
            FromWorker::CallBody => {
                let arrived = self.streams.lock().calls.body(frame.stream, &frame.data);
                self.arrived(frame.stream, arrived, callbacks);
                return Ok(());
            }
            FromWorker::CallEnd => {
                let ended = self.streams.lock().calls.end(frame.stream);
                if let Some((head, args)) = ended {
                    self.arrived(frame.stream, Arrived::Ready(head, args), callbacks);
                }
                return Ok(());
            }
            FromWorker::CallCancel => {
                if let Some(task) = self.streams.lock().calls.done(frame.stream) {
                    task.abort();
                }
                return Ok(());
            }
            FromWorker::Acquire => {
                let head: AcquireHead = frame.head()?;
                let (conn, callbacks) = (self.clone(), callbacks.clone());
                tokio::spawn(async move {
                    let result = match callbacks.acquire(head.model_id).await {
                        Ok(held) => conn.hold_for(head.request, held),
                        Err(error) => CallResultHead::failed(error),
                    };
                    conn.send(wire::encode(
                        ToWorker::CallResult,
                        frame.stream,
                        Some(&result),
                        b"",
                    ));
                });
                return Ok(());
            }
            FromWorker::Ready | FromWorker::Fatal => {
                return Err(WireError::Malformed(format!(
                    "a {:?} frame after start",
                    frame.ty
                )));
            }
        };
        // Never waits: a slow reader's stream holds at most its window (the worker waits for
        // credit past it), and the other streams go on.
        if let Some(entry) = self.streams.lock().requests.get(&frame.stream) {
            let _ = entry.events.send(event);
        }
        Ok(())
    }

    /// Runs a handle call whose arguments are complete (answering the worker as the result
    /// arrives), or answers a refusal.
    fn arrived(self: &Arc<Self>, stream: u32, arrived: Arrived, callbacks: &Arc<dyn Callbacks>) {
        let (head, args) = match arrived {
            Arrived::Waiting => return,
            Arrived::TooLarge(error) => {
                let head = CallResultHead::failed(error);
                self.send(wire::encode(ToWorker::CallResult, stream, Some(&head), b""));
                return;
            }
            Arrived::Ready(head, args) => (head, args),
        };
        let (conn, callbacks) = (self.clone(), callbacks.clone());
        // Registered before it can finish, so that its own `done` removes it.
        let mut streams = self.streams.lock();
        let task = tokio::spawn(async move {
            let answer = callbacks.call(head, args).await;
            calls::relay(stream, answer, |frame| conn.send(frame)).await;
            conn.streams.lock().calls.done(stream);
        });
        if streams.closed.is_some() {
            task.abort();
        } else {
            streams.calls.running(stream, task.abort_handle());
        }
    }

    fn hold_for(&self, request: u32, held: Box<dyn Send + Sync>) -> CallResultHead {
        let mut streams = self.streams.lock();
        match streams.requests.get_mut(&request) {
            Some(entry) => {
                entry.held.push(held);
                CallResultHead::answered(200, false)
            }
            None => CallResultHead::failed(wire::CallError::new(
                "RuntimeError",
                format!("request {request} is not in progress"),
                400,
            )),
        }
    }

    /// Sends the rest of a request's body, then its end.
    pub(crate) fn send_body_chunk(&self, id: u32, chunk: &[u8]) {
        for part in chunk.chunks(wire::CHUNK) {
            self.send(wire::encode(ToWorker::RequestBody, id, None::<&()>, part));
        }
    }

    /// Says a request's body is complete.
    pub(crate) fn send_body_end(&self, id: u32) {
        self.send(wire::encode(ToWorker::RequestEnd, id, None::<&()>, b""));
    }
}

/// A request in flight on a worker. Dropped before its response ended, it cancels the
/// request in the worker.
pub(crate) struct RequestStream {
    conn: Arc<Conn>,
    id: u32,
    events: mpsc::UnboundedReceiver<Event>,
    finished: bool,
    /// Body bytes taken and not yet credited back to the worker.
    uncredited: usize,
}

impl RequestStream {
    /// Its stream id.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The next event; `Gone` when the worker went away.
    pub(crate) async fn next(&mut self) -> Event {
        let event = self
            .events
            .recv()
            .await
            .unwrap_or_else(|| Event::Gone(self.conn.closed_reason().unwrap_or_default()));
        match &event {
            Event::End | Event::Error(_) | Event::Gone(_) => self.finish(),
            Event::Start(_, bytes) | Event::Body(bytes) => self.credit(bytes.len().max(1)),
        }
        event
    }

    /// Counts `bytes` as taken, and gives the worker room for more once enough were.
    fn credit(&mut self, bytes: usize) {
        self.uncredited += bytes;
        if self.uncredited >= wire::CREDIT_EVERY && !self.finished {
            let n = u32::try_from(self.uncredited).unwrap_or(u32::MAX);
            self.uncredited = 0;
            self.conn.send(wire::encode(
                ToWorker::Credit,
                self.id,
                None::<&()>,
                &n.to_be_bytes(),
            ));
        }
    }

    /// The response is complete: the stream is closed without cancelling.
    pub(crate) fn finish(&mut self) {
        if !self.finished {
            self.finished = true;
            self.conn.finish_request(self.id, false);
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            self.conn.finish_request(self.id, true);
        }
    }
}

async fn write_loop(mut queue: mpsc::UnboundedReceiver<Bytes>, mut writer: OwnedWriteHalf) {
    let mut buf = BytesMut::new();
    while let Some(first) = queue.recv().await {
        // Frames queued meanwhile go out in the same write.
        buf.clear();
        buf.extend_from_slice(&first);
        while buf.len() < 256 << 10 {
            match queue.try_recv() {
                Ok(more) => buf.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if writer.write_all(&buf).await.is_err() {
            break;
        }
    }
}

async fn read_loop(conn: Arc<Conn>, reader: OwnedReadHalf, callbacks: Arc<dyn Callbacks>) {
    let mut reader = tokio::io::BufReader::with_capacity(64 << 10, reader);
    let reason = loop {
        match wire::read_frame(&mut reader).await {
            Ok(Some(frame)) => {
                if let Err(e) = conn.route(frame, &callbacks).await {
                    break e.to_string();
                }
            }
            Ok(None) => break "the worker closed its connection".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    conn.fail_all(&reason);
}
