//! Starting a worker process: its private socket, its command line and spec (on stdin), its
//! output into
//! modelmux's log, and the wait for `READY` (or the reason it never came).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncBufReadExt, AsyncRead};
use tokio::net::unix::OwnedReadHalf;
use tokio::net::{UnixListener, UnixStream};
use tokio::process::{Child, Command};

use crate::conn::{Callbacks, Conn};
use crate::wire::{self, FatalHead, Frame, FromWorker, ReadyHead};

/// How to start one replica's worker.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The interpreter.
    pub(crate) python: PathBuf,
    /// The worker's spec (`docs/python-worker-protocol.md`), without `socket`.
    pub(crate) spec: serde_json::Map<String, serde_json::Value>,
    /// The replica, for log lines.
    pub(crate) replica_id: String,
    /// Longest wait for `READY`.
    pub(crate) start_timeout: Duration,
}

/// A worker that said `READY`.
pub(crate) struct Started {
    pub(crate) conn: Arc<Conn>,
    pub(crate) child: Child,
    pub(crate) pid: u32,
}

/// Lines of a worker's stderr kept to explain a failed start.
const KEPT_LINES: usize = 20;

/// Starts a worker and waits for it to be ready.
pub(crate) async fn start(
    launch: &Launch,
    callbacks: Arc<dyn Callbacks>,
) -> Result<Started, String> {
    let (dir, socket, listener) = listen()?;
    let mut child = spawn(launch, &socket)?;
    let pid = child.id().unwrap_or_default();
    let last_lines = forward_output(&mut child, &launch.replica_id);
    let accepted = accept(&listener, &mut child, launch, &last_lines).await?;
    drop(listener);
    drop(dir);
    let (read, write) = Conn::split(accepted);
    // Unbuffered: nothing after READY may be read into a buffer the connection would lose.
    let mut read = read;
    let first = first_frame(&mut read, &mut child, launch, &last_lines).await?;
    ready(&first, &launch.replica_id)?;
    let conn = Conn::start(read, write, callbacks);
    Ok(Started { conn, child, pid })
}

/// The worker's private socket: a directory of its own (removed when dropped), the socket's
/// path in it, and the listener on it.
fn listen() -> Result<(tempfile::TempDir, PathBuf, UnixListener), String> {
    let dir = tempfile::Builder::new()
        .prefix("modelmux-worker-")
        .tempdir()
        .map_err(|e| format!("cannot make the worker's socket directory: {e}"))?;
    let socket = dir.path().join("worker.sock");
    let listener = UnixListener::bind(&socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    Ok((dir, socket, listener))
}

/// Spawns the worker's interpreter, its output piped, and writes it its spec (with `socket`
/// and `parent_pid`) on stdin.
fn spawn(launch: &Launch, socket: &std::path::Path) -> Result<Child, String> {
    let mut spec = launch.spec.clone();
    spec.insert(
        "socket".into(),
        socket.to_string_lossy().into_owned().into(),
    );
    // The worker asks the kernel to kill it when this process exits.
    spec.insert("parent_pid".into(), std::process::id().into());
    let spec = serde_json::Value::Object(spec).to_string();
    // The spec goes on stdin, not the command line, which every account reads in `ps`: it
    // holds the deployment's `user_config`.
    let mut child = Command::new(&launch.python)
        .args(["-m", "modelmux._worker", "--spec", "-"])
        .env("PYTHONUNBUFFERED", "1")
        // The admin token (which also lets cluster nodes call each other's deployments) is the
        // server's, never user code's.
        .env_remove("MODELMUX_ADMIN_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", launch.python.display()))?;
    if let Some(mut stdin) = child.stdin.take() {
        // Closed once written: the worker reads it to its end. A worker that exits first is
        // reported by its exit, while `start` waits for it.
        tokio::spawn(async move {
            use tokio::io::AsyncWriteExt;
            let _ = stdin.write_all(spec.as_bytes()).await;
        });
    }
    Ok(child)
}

/// The last [`KEPT_LINES`] lines of a worker's stderr.
type LastLines = Arc<Mutex<VecDeque<String>>>;

/// Sends the worker's stdout and stderr into modelmux's log, keeping stderr's last lines.
fn forward_output(child: &mut Child, replica_id: &str) -> LastLines {
    let last_lines = Arc::new(Mutex::new(VecDeque::new()));
    if let Some(out) = child.stdout.take() {
        tokio::spawn(forward_lines(out, replica_id.to_owned(), "stdout", None));
    }
    if let Some(err) = child.stderr.take() {
        let kept = Some(last_lines.clone());
        tokio::spawn(forward_lines(err, replica_id.to_owned(), "stderr", kept));
    }
    last_lines
}

/// `what` went wrong, followed by the worker's last lines of stderr if it wrote any.
fn explain(last_lines: &LastLines, what: String) -> String {
    let lines = last_lines.lock();
    if lines.is_empty() {
        what
    } else {
        let tail: Vec<&str> = lines.iter().map(String::as_str).collect();
        format!("{what}; its last lines:\n{}", tail.join("\n"))
    }
}

/// The worker's connection to its socket, unless it exits or `start_timeout` passes first.
async fn accept(
    listener: &UnixListener,
    child: &mut Child,
    launch: &Launch,
    last_lines: &LastLines,
) -> Result<UnixStream, String> {
    tokio::select! {
        accepted = listener.accept() => Ok(accepted.map_err(|e| format!("the worker's socket failed: {e}"))?.0),
        status = child.wait() => {
            // Let the last lines of its stderr reach the log and the message.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            Err(explain(last_lines, format!("the worker exited before it was ready ({status})")))
        }
        () = tokio::time::sleep(launch.start_timeout) => {
            Err(explain(last_lines, format!("the worker was not ready within {:?}", launch.start_timeout)))
        }
    }
}

/// The first frame the worker sends on its connection, within `start_timeout`.
async fn first_frame(
    read: &mut OwnedReadHalf,
    child: &mut Child,
    launch: &Launch,
    last_lines: &LastLines,
) -> Result<Frame, String> {
    let first = tokio::time::timeout(launch.start_timeout, wire::read_frame(read)).await;
    match first {
        Ok(Ok(Some(frame))) => Ok(frame),
        Ok(Ok(None)) => {
            let _ = child.wait().await;
            Err(explain(
                last_lines,
                "the worker closed its socket before it was ready".into(),
            ))
        }
        Ok(Err(e)) => Err(explain(last_lines, e.to_string())),
        Err(_) => Err(explain(
            last_lines,
            "the worker connected but never said it was ready".into(),
        )),
    }
}

/// Whether the worker's first frame says `READY`: a `FATAL` says why the deployment did not
/// start, anything else is out of turn.
fn ready(frame: &Frame, replica_id: &str) -> Result<(), String> {
    match frame.ty {
        FromWorker::Ready => {
            let ready: ReadyHead = frame.head().map_err(|e| e.to_string())?;
            tracing::debug!(replica = %replica_id, pid = ready.pid, multiplexed = ready.multiplexed, "Python worker ready");
            Ok(())
        }
        FromWorker::Fatal => {
            let fatal: FatalHead = frame.head().map_err(|e| e.to_string())?;
            let at = fatal
                .location
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            Err(format!("the deployment did not start{at}: {}", fatal.error))
        }
        other => Err(format!("the worker sent {other:?} before READY")),
    }
}

async fn forward_lines(
    stream: impl AsyncRead + Unpin,
    replica: String,
    which: &'static str,
    kept: Option<Arc<Mutex<VecDeque<String>>>>,
) {
    let mut lines = tokio::io::BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        tracing::info!(target: "modelmux::python", replica = %replica, stream = which, "{line}");
        if let Some(kept) = &kept {
            let mut kept = kept.lock();
            if kept.len() == KEPT_LINES {
                kept.pop_front();
            }
            kept.push_back(line);
        }
    }
}
