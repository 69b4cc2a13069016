//! The frames between modelmux and a Python worker, as `docs/python-worker-protocol.md`
//! specifies them: `u32 length | u8 type | u32 stream | u32 head_len | head JSON | data`.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt};

/// The largest frame either side sends or accepts (the bytes after the length field).
pub(crate) const MAX_FRAME: usize = 16 << 20;
/// Bodies are sent in chunks of at most this many bytes.
pub(crate) const CHUNK: usize = 1 << 20;
/// Bytes of one response's body a worker may send beyond what the response's reader took:
/// the worker waits for credit (`Credit` frames) past it, so that a slow reader holds at most
/// this (and one chunk) here, and never stalls the connection's other streams.
pub(crate) const RESPONSE_WINDOW: usize = 1 << 20;
/// Bytes a response's reader takes before they are credited back to the worker.
pub(crate) const CREDIT_EVERY: usize = RESPONSE_WINDOW / 4;
/// The largest arguments (pickled) a worker's handle call may send.
pub(crate) const MAX_CALL_ARGS: usize = 512 << 20;

/// Frame types sent to the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ToWorker {
    Request = 1,
    RequestBody = 2,
    RequestEnd = 3,
    Cancel = 4,
    Control = 5,
    CallResult = 7,
    CallResultBody = 8,
    CallResultEnd = 9,
    /// More room for one response's body: `data` is a `u32` (big-endian) of bytes.
    Credit = 10,
}

/// Frame types the worker sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FromWorker {
    Ready,
    Fatal,
    Start,
    Body,
    End,
    Error,
    Reply,
    Call,
    Acquire,
    CallBody,
    CallEnd,
    CallCancel,
}

impl FromWorker {
    fn from_u8(t: u8) -> Option<Self> {
        Some(match t {
            16 => Self::Ready,
            17 => Self::Fatal,
            18 => Self::Start,
            19 => Self::Body,
            20 => Self::End,
            21 => Self::Error,
            22 => Self::Reply,
            23 => Self::Call,
            24 => Self::Acquire,
            25 => Self::CallBody,
            26 => Self::CallEnd,
            27 => Self::CallCancel,
            _ => return None,
        })
    }
}

/// One frame, encoded, ready to write.
pub(crate) fn encode(
    ty: ToWorker,
    stream: u32,
    head: Option<&impl Serialize>,
    data: &[u8],
) -> Bytes {
    let head = head.map(|h| serde_json::to_vec(h).expect("heads are plain JSON"));
    let head_len = head.as_ref().map_or(0, Vec::len);
    let mut out = BytesMut::with_capacity(13 + head_len + data.len());
    out.put_u32((9 + head_len + data.len()) as u32);
    out.put_u8(ty as u8);
    out.put_u32(stream);
    out.put_u32(head_len as u32);
    if let Some(head) = head {
        out.put_slice(&head);
    }
    out.put_slice(data);
    out.freeze()
}

/// A frame from the worker.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) ty: FromWorker,
    pub(crate) stream: u32,
    head: Bytes,
    pub(crate) data: Bytes,
}

impl Frame {
    /// Its head, parsed as `T`.
    pub(crate) fn head<T: for<'de> Deserialize<'de>>(&self) -> Result<T, WireError> {
        serde_json::from_slice(&self.head)
            .map_err(|e| WireError::Malformed(format!("a {:?} frame's head: {e}", self.ty)))
    }
}

/// Why the connection to a worker cannot go on.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    /// The socket failed or closed.
    #[error("the connection to the worker ended: {0}")]
    Io(#[from] std::io::Error),
    /// The worker sent something the protocol does not allow.
    #[error("the worker broke the protocol: {0}")]
    Malformed(String),
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub(crate) async fn read_frame(
    reader: &mut (impl AsyncRead + Unpin),
) -> Result<Option<Frame>, WireError> {
    let len = match reader.read_u32().await {
        Ok(len) => len as usize,
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    if !(9..=MAX_FRAME).contains(&len) {
        return Err(WireError::Malformed(format!(
            "a frame of {len} bytes (9 to {MAX_FRAME} allowed)"
        )));
    }
    let mut buf = BytesMut::zeroed(len);
    reader.read_exact(&mut buf).await?;
    let mut buf = buf.freeze();
    let ty = buf.get_u8();
    let ty = FromWorker::from_u8(ty)
        .ok_or_else(|| WireError::Malformed(format!("unknown frame type {ty}")))?;
    let stream = buf.get_u32();
    let head_len = buf.get_u32() as usize;
    if head_len > buf.len() {
        return Err(WireError::Malformed(format!(
            "a head of {head_len} bytes in a frame of {len}"
        )));
    }
    let head = buf.split_to(head_len);
    Ok(Some(Frame {
        ty,
        stream,
        head,
        data: buf,
    }))
}

/// The head of a `REQUEST`.
#[derive(Debug, Serialize)]
pub(crate) struct RequestHead<'a> {
    pub(crate) method: &'a str,
    pub(crate) scheme: &'a str,
    pub(crate) path: &'a str,
    pub(crate) raw_path: &'a str,
    pub(crate) query_string: &'a str,
    pub(crate) root_path: &'a str,
    pub(crate) headers: Vec<(&'a str, String)>,
    pub(crate) client: Option<(String, u16)>,
    pub(crate) http_version: &'a str,
    pub(crate) model_id: Option<&'a str>,
    pub(crate) request_id: &'a str,
    pub(crate) call: Option<&'a str>,
    /// A `stream=True` handle call: the method's items go back as records.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) stream: bool,
    pub(crate) more: bool,
}

/// An error the worker reports: a Python exception.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub(crate) struct PyError {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) message: String,
}

impl std::fmt::Display for PyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// The head of `START`.
#[derive(Debug, Deserialize)]
pub(crate) struct StartHead {
    pub(crate) status: u16,
    #[serde(default)]
    pub(crate) headers: Vec<(String, String)>,
    #[serde(default)]
    pub(crate) more: bool,
}

/// The head of `READY`.
#[derive(Debug, Deserialize)]
pub(crate) struct ReadyHead {
    pub(crate) pid: u32,
    #[serde(default)]
    pub(crate) multiplexed: bool,
}

/// The head of `FATAL`.
#[derive(Debug, Deserialize)]
pub(crate) struct FatalHead {
    #[serde(flatten)]
    pub(crate) error: PyError,
    #[serde(default, rename = "where")]
    pub(crate) location: Option<String>,
}

/// The head of a `REPLY`.
#[derive(Debug, Deserialize)]
pub(crate) struct ReplyHead {
    pub(crate) ok: bool,
    #[serde(default)]
    pub(crate) size_bytes: Option<u64>,
    #[serde(default)]
    pub(crate) error: Option<PyError>,
}

/// The head of a `CALL`.
#[derive(Debug, Deserialize)]
pub(crate) struct CallHead {
    pub(crate) deployment: String,
    #[serde(default)]
    pub(crate) app: Option<String>,
    #[serde(default = "call_method")]
    pub(crate) method: String,
    #[serde(default)]
    pub(crate) model_id: Option<String>,
    /// The arguments go on in `CALL_BODY` frames, up to a `CALL_END`.
    #[serde(default)]
    pub(crate) more: bool,
    /// `stream=True`: the callee's method is a generator whose items come back one by one.
    #[serde(default)]
    pub(crate) stream: bool,
}

fn call_method() -> String {
    "__call__".into()
}

/// The head of an `ACQUIRE`.
#[derive(Debug, Deserialize)]
pub(crate) struct AcquireHead {
    pub(crate) model_id: String,
    pub(crate) request: u32,
}

/// The head of a `CALL_RESULT`.
#[derive(Debug, Serialize)]
pub(crate) struct CallResultHead {
    pub(crate) ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<u16>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) exception: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<CallError>,
    /// The result goes on in `CALL_RESULT_BODY` frames, up to a `CALL_RESULT_END`.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) more: bool,
}

impl CallResultHead {
    /// The callee answered (`exception`: with the exception its method raised).
    pub(crate) fn answered(status: u16, exception: bool) -> Self {
        Self {
            ok: true,
            status: Some(status),
            exception,
            error: None,
            more: false,
        }
    }

    /// The call did not reach its target, or failed on the way.
    pub(crate) fn failed(error: CallError) -> Self {
        Self {
            ok: false,
            status: None,
            exception: false,
            error: Some(error),
            more: false,
        }
    }
}

/// The head of a `CALL_RESULT_END`: the error that cut the result short, if one did.
#[derive(Debug, Serialize)]
pub(crate) struct CallEndHead {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<CallError>,
}

/// Why a call or acquire did not reach its target.
#[derive(Debug, Serialize)]
pub(crate) struct CallError {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) message: String,
    pub(crate) status: u16,
}

impl CallError {
    /// An error of Python type `kind` (the caller raises one so named) with HTTP `status`.
    pub(crate) fn new(kind: &str, message: impl Into<String>, status: u16) -> Self {
        Self {
            kind: kind.into(),
            message: message.into(),
            status,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_frame_reads_back_as_written() {
        // The worker's frame types differ from ours; re-tag an encoded frame as START.
        let head = serde_json::json!({"status": 201, "headers": [["a", "b"]], "more": true});
        let mut bytes = encode(ToWorker::Request, 7, Some(&head), b"hello").to_vec();
        bytes[4] = 18;
        let frame = read_frame(&mut bytes.as_slice()).await.unwrap().unwrap();
        assert_eq!(frame.ty, FromWorker::Start);
        assert_eq!(frame.stream, 7);
        assert_eq!(&frame.data[..], b"hello");
        let start: StartHead = frame.head().unwrap();
        assert_eq!((start.status, start.more), (201, true));
        assert_eq!(start.headers, vec![("a".to_string(), "b".to_string())]);
    }

    #[tokio::test]
    async fn bad_frames_are_refused() {
        let too_long = ((MAX_FRAME + 1) as u32).to_be_bytes();
        assert!(read_frame(&mut too_long.as_slice()).await.is_err());
        let mut unknown = encode(ToWorker::Cancel, 1, None::<&()>, b"").to_vec();
        unknown[4] = 99;
        assert!(read_frame(&mut unknown.as_slice()).await.is_err());
        let mut lying = encode(ToWorker::Cancel, 1, None::<&()>, b"").to_vec();
        lying[4] = 20;
        lying[12] = 50; // head_len past the frame
        assert!(read_frame(&mut lying.as_slice()).await.is_err());
        assert!(
            read_frame(&mut [0u8; 0].as_slice())
                .await
                .unwrap()
                .is_none()
        );
    }
}
