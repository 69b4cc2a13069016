//! Downloads into the disk cache: one object's `HEAD` and `GET` under its retry policy, each
//! attempt streamed into a temporary file and verified (size, and MD5 against a plain S3 ETag)
//! before the caller renames it into place.

use std::io::Write as _;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::stream::BoxStream;

use super::*;

/// The object's size, from a `HEAD` under its retry policy.
pub(crate) async fn head_size(object: &Object) -> Result<u64, StoreError> {
    let meta = with_retries(object, |_| async {
        let head = object_store::GetOptions::new().with_head(true);
        let get = object.store.get_opts(&object.location, head);
        match tokio::time::timeout(object.retry.attempt_timeout, get).await {
            Ok(result) => result.map(|r| r.meta).map_err(Attempt::Store),
            Err(_) => Err(Attempt::Timeout),
        }
    })
    .await?;
    Ok(meta.size)
}

/// A download's temporary file: removed unless it was renamed into place, also when the
/// download is cancelled half-way (then after its writer thread has let go of it).
pub(super) struct TempFile {
    pub(super) path: PathBuf,
    pub(super) writer: Option<tokio::task::JoinHandle<std::io::Result<u64>>>,
    pub(super) kept: bool,
}

impl TempFile {
    /// It was renamed into place: leave it.
    pub(super) fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        match self.writer.take() {
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
            Some(writer) => {
                let path = std::mem::take(&mut self.path);
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move {
                        let _ = writer.await;
                        let _ = tokio::fs::remove_file(path).await;
                    });
                }
            }
        }
    }
}

/// Why one attempt failed.
pub(super) enum Attempt {
    /// The store said no.
    Store(object_store::Error),
    /// The transfer ended short or corrupt.
    Verify(String),
    /// Writing the local file failed: not worth retrying.
    Local(StoreError),
    /// The attempt ran out of time.
    Timeout,
}

/// Runs `attempt` (numbered from 1) under the object's retry policy: each attempt bounded by
/// its timeout, transient failures retried after a jittered backoff, the rest returned at once.
pub(super) async fn with_retries<T, F, Fut>(
    object: &Object,
    mut attempt: F,
) -> Result<T, StoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, Attempt>>,
{
    let policy = object.retry;
    let attempts = policy.attempts.max(1);
    let mut last = String::new();
    for n in 1..=attempts {
        // Downloads watch their own deadline (so they can clean up); this one is the backstop.
        let backstop = policy.attempt_timeout + Duration::from_secs(5);
        match tokio::time::timeout(backstop, attempt(n)).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(Attempt::Store(e))) => match classify(&e) {
                Failure::NotFound => {
                    return Err(StoreError::NotFound {
                        id: object.id.clone(),
                        file: object.file.clone(),
                        repository: object.repository.clone(),
                        key: object.location.to_string(),
                    });
                }
                Failure::Denied => {
                    return Err(StoreError::PermissionDenied {
                        id: object.id.clone(),
                        repository: object.repository.clone(),
                        message: e.to_string(),
                    });
                }
                Failure::Transient => last = e.to_string(),
                Failure::Permanent => {
                    return Err(StoreError::Store {
                        id: object.id.clone(),
                        repository: object.repository.clone(),
                        message: crate::client::message(&e),
                    });
                }
            },
            Ok(Err(Attempt::Verify(message))) => last = message,
            Ok(Err(Attempt::Local(e))) => return Err(e),
            Ok(Err(Attempt::Timeout)) | Err(_) => {
                last = format!(
                    "the attempt did not finish within its timeout of {:?}",
                    policy.attempt_timeout
                );
            }
        }
        if n < attempts {
            let pause = policy.backoff(n + 1);
            tracing::warn!(
                model_id = %object.id, file = %object.file, repository = %object.repository,
                attempt = n, of = attempts, retry_in_ms = pause.as_millis() as u64, error = %last,
                "Model download attempt failed; retrying"
            );
            tokio::time::sleep(pause).await;
        }
    }
    Err(StoreError::Transfer {
        id: object.id.clone(),
        repository: object.repository.clone(),
        attempts,
        last,
    })
}

/// A verified download.
pub(super) struct Downloaded {
    pub(super) size: u64,
    /// The file's MD5, as hex.
    pub(super) md5: String,
    /// The object's ETag when it was read.
    pub(super) etag: Option<String>,
}

/// One download attempt into `tmp`. The body streams to two threads at once: one writes the
/// file, one hashes (when there is a checksum to check), so hashing, writing and receiving
/// overlap. Then size and checksum are checked against the store's word.
pub(super) async fn download(object: &Object, tmp: &mut TempFile) -> Result<Downloaded, Attempt> {
    let deadline = tokio::time::Instant::now() + object.retry.attempt_timeout;
    let result = open(object, deadline).await?;
    let expected = result.meta.size;
    let etag = result.meta.e_tag.clone();
    let expected_md5 = if object.etag_is_md5 {
        result.meta.e_tag.as_deref().and_then(plain_md5_etag)
    } else {
        None
    };
    let to_writer = spawn_writer(tmp);
    // Every download is hashed: against a plain S3 ETag now, and into the sidecar that lets a
    // later run check the file before using it again.
    let (to_hasher, hasher) = spawn_hasher();
    let sinks = Sinks {
        writer: to_writer,
        hasher: to_hasher,
    };
    let mut stream = result.into_stream();
    let failed = receive(object, &mut stream, expected, deadline, sinks).await;
    let size = written(tmp, failed).await?;
    if size != expected {
        return Err(Attempt::Verify(format!(
            "the transfer was truncated: {size} of {expected} bytes arrived"
        )));
    }
    let md5 = hex(&hasher
        .await
        .map_err(|e| Attempt::Local(StoreError::io(&tmp.path, std::io::Error::other(e))))?);
    check_md5(&md5, expected_md5)?;
    Ok(Downloaded { size, md5, etag })
}

/// The object's `GET`, its answer awaited until `deadline`.
async fn open(
    object: &Object,
    deadline: tokio::time::Instant,
) -> Result<object_store::GetResult, Attempt> {
    let get = object
        .store
        .get_opts(&object.location, object_store::GetOptions::default());
    tokio::time::timeout_at(deadline, get)
        .await
        .map_err(|_| Attempt::Timeout)?
        .map_err(Attempt::Store)
}

/// Starts the thread that writes the chunks it is sent into `tmp`'s file (`tmp` holds it) and
/// returns where to send them; dropping the sender ends the file.
fn spawn_writer(tmp: &mut TempFile) -> tokio::sync::mpsc::Sender<Bytes> {
    let (to_writer, mut chunks) = tokio::sync::mpsc::channel::<Bytes>(64);
    let path = tmp.path.clone();
    tmp.writer = Some(tokio::task::spawn_blocking(
        move || -> std::io::Result<u64> {
            let file = std::fs::File::create(&path)?;
            let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
            let mut written = 0u64;
            while let Some(chunk) = chunks.blocking_recv() {
                out.write_all(&chunk)?;
                written += chunk.len() as u64;
            }
            out.flush()?;
            Ok(written)
        },
    ));
    to_writer
}

/// Starts the thread that hashes the chunks it is sent: where to send them, and the MD5 once
/// the sender is dropped.
fn spawn_hasher() -> (
    tokio::sync::mpsc::Sender<Bytes>,
    tokio::task::JoinHandle<[u8; 16]>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
    let hasher = tokio::task::spawn_blocking(move || {
        let mut hash = Md5::new();
        while let Some(chunk) = rx.blocking_recv() {
            hash.update(&chunk);
        }
        <[u8; 16]>::from(hash.finalize())
    });
    (tx, hasher)
}

/// Where each chunk of the body goes: the writer thread and the hasher thread.
struct Sinks {
    writer: tokio::sync::mpsc::Sender<Bytes>,
    hasher: tokio::sync::mpsc::Sender<Bytes>,
}

/// Streams the body (`expected` bytes) to both threads until it ends, `deadline` passes or a
/// thread stops listening, logging progress; the failure that ended it early, if any (a thread
/// that stopped listening is not one: its error is read from it). Both senders are dropped on
/// return, which ends both threads' input.
async fn receive(
    object: &Object,
    stream: &mut BoxStream<'static, object_store::Result<Bytes>>,
    expected: u64,
    deadline: tokio::time::Instant,
    sinks: Sinks,
) -> Option<Attempt> {
    let name = format!("{}/{}/{}", object.repository, object.id, object.file);
    let mut progress = super::progress::Progress::new(name, expected, tokio::time::Instant::now());
    loop {
        let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return Some(Attempt::Timeout),
            Ok(None) => return None,
            Ok(Some(Err(e))) => return Some(Attempt::Store(e)),
            Ok(Some(Ok(chunk))) => chunk,
        };
        if let Some(line) = progress.received(chunk.len() as u64, tokio::time::Instant::now()) {
            tracing::info!("{line}");
        }
        // Sending waits while a thread is behind, so the deadline covers that too. A closed
        // channel means the writer failed; `written` reads its error.
        let sent = async {
            if sinks.hasher.send(chunk.clone()).await.is_err() {
                return false;
            }
            sinks.writer.send(chunk).await.is_ok()
        };
        match tokio::time::timeout_at(deadline, sent).await {
            Ok(true) => {}
            Ok(false) => return None,
            Err(_) => return Some(Attempt::Timeout),
        }
    }
}

/// Waits for the writer thread (joined in place: if this attempt is cancelled here, the
/// TempFile still owns the writer and removes the file only once the writer has let go of it)
/// and returns the bytes it wrote: a writer that panicked first, then the transfer's own
/// `failed`, then the writer's I/O error.
async fn written(tmp: &mut TempFile, failed: Option<Attempt>) -> Result<u64, Attempt> {
    let joined = tmp.writer.as_mut().expect("set by spawn_writer").await;
    tmp.writer = None;
    let written =
        joined.map_err(|e| Attempt::Local(StoreError::io(&tmp.path, std::io::Error::other(e))))?;
    if let Some(failure) = failed {
        return Err(failure);
    }
    written.map_err(|e| Attempt::Local(StoreError::io(&tmp.path, e)))
}

/// The file's MD5 against the object's plain S3 ETag, when it has one.
fn check_md5(md5: &str, expected_md5: Option<String>) -> Result<(), Attempt> {
    if let Some(expected_md5) = expected_md5
        && md5 != expected_md5
    {
        return Err(Attempt::Verify(format!(
            "the transfer was corrupted: its MD5 {md5} does not match the object's ETag \
                 {expected_md5} (objects encrypted with SSE-KMS or SSE-C have ETags that are \
                 not MD5s: set verify_md5 to false for such buckets)"
        )));
    }
    Ok(())
}

/// The MD5 an S3 ETag stands for: only for objects uploaded in one part (multipart ETags end
/// in `-<parts>` and are not an MD5 of the content).
fn plain_md5_etag(etag: &str) -> Option<String> {
    let etag = etag.trim_matches('"').to_ascii_lowercase();
    (etag.len() == 32 && etag.bytes().all(|b| b.is_ascii_hexdigit())).then_some(etag)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_single_part_etags_are_checksums() {
        assert_eq!(
            plain_md5_etag("\"D41D8CD98F00B204E9800998ECF8427E\"").as_deref(),
            Some("d41d8cd98f00b204e9800998ecf8427e")
        );
        assert_eq!(
            plain_md5_etag("\"d41d8cd98f00b204e9800998ecf8427e-3\""),
            None
        );
        assert_eq!(plain_md5_etag("1a2b-3c"), None);
    }
}
