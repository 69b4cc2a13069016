//! The local disk cache for models from remote repositories.
//!
//! It is a [`Multiplexer`] of files: the same cache that holds models in memory, here holding
//! downloaded files on disk, bounded in bytes. That gives it, already tested, everything a disk
//! cache needs:
//!
//! - **download once**: concurrent fetches of one object share one download (single flight);
//! - **a byte bound with LRU eviction**, where the probe (a `HEAD`) tells the exact size before
//!   room is made, and a missing object fails before anything is evicted;
//! - **no file deleted while it is read**: a [`ModelFile`](crate::ModelFile) pins its file, and
//!   an evicted file is deleted only when its last reader is done;
//! - failures remembered for a short backoff, so a missing model cannot hammer the store.
//!
//! Each download streams into a temporary file under `tmp/`, hashing as it goes, and is renamed
//! into `files/` only once its size (and, for S3, its MD5 against the ETag) is verified. A
//! crash, a timeout or a short read leaves at most a temporary file, never one under a final
//! name. The directory is emptied when the cache opens, so nothing from an earlier process is
//! trusted; a lock file keeps two processes from sharing one directory.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use md5::{Digest, Md5};
use modelmux_cache::{
    BoxError, Error as CacheError, Loader, Model, ModelGuard, ModelId, Multiplexer,
};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;

use crate::StoreError;
use crate::retry::{Failure, RetryPolicy, classify};

const MARKER: &str = ".modelmux-disk-cache";

/// A byte-bounded cache of downloaded model files in a local directory, shared by every
/// repository (and every replica) of a process that is given it. Cloning shares it.
#[derive(Clone)]
pub struct DiskCache {
    files: Multiplexer<CachedFile>,
    shared: Arc<Shared>,
}

struct Shared {
    dir: PathBuf,
    files_dir: PathBuf,
    tmp_dir: PathBuf,
    max_bytes: u64,
    /// What each cache key stands for (the loader only gets the key), and how many fetches of
    /// it are under way.
    objects: Mutex<HashMap<ModelId, (Arc<Object>, usize)>>,
    next_tmp: AtomicU64,
    downloads: AtomicU64,
    download_bytes: AtomicU64,
    /// Whether the directory goes when the cache does.
    temporary: std::sync::atomic::AtomicBool,
    /// Held for the cache's lifetime: the lock that keeps other processes out.
    _lock: std::fs::File,
}

/// A remote object the cache may be asked to fetch.
pub(crate) struct Object {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) location: ObjectPath,
    pub(crate) repository: String,
    pub(crate) id: String,
    pub(crate) file: String,
    pub(crate) etag_is_md5: bool,
    pub(crate) retry: RetryPolicy,
    /// The repository's instance (see `cache_key`).
    pub(crate) instance: u64,
}

/// Counters of a [`DiskCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DiskCacheStats {
    /// Downloads completed and verified.
    pub downloads: u64,
    /// Bytes of those downloads.
    pub download_bytes: u64,
    /// Files in the cache now.
    pub files: usize,
    /// Bytes held: the files, downloads under way, and evicted files still being read.
    pub bytes: u64,
    /// The byte bound.
    pub max_bytes: u64,
}

impl DiskCache {
    /// Opens a cache in `dir` holding at most `max_bytes` of files.
    ///
    /// `dir` is created if needed. It must be empty or a cache directory from an earlier run
    /// (which is emptied: files from another process are not trusted), and no other process
    /// may be using it. Must be called inside a Tokio runtime.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| StoreError::io(&dir, e))?;
        let marker = dir.join(MARKER);
        if !marker.exists() {
            let mut entries = std::fs::read_dir(&dir).map_err(|e| StoreError::io(&dir, e))?;
            if entries.next().is_some() {
                return Err(StoreError::Config(format!(
                    "disk cache directory {} is not empty and is not a modelmux disk cache; \
                     give the cache a directory of its own (it deletes what it finds there)",
                    dir.display()
                )));
            }
            std::fs::write(
                &marker,
                b"modelmux disk cache: emptied when a server starts\n",
            )
            .map_err(|e| StoreError::io(&marker, e))?;
        }
        let lock_path = dir.join(".lock");
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| StoreError::io(&lock_path, e))?;
        lock.try_lock().map_err(|_| {
            StoreError::Config(format!(
                "disk cache directory {} is in use by another process; give each server its own",
                dir.display()
            ))
        })?;
        let files_dir = dir.join("files");
        let tmp_dir = dir.join("tmp");
        for sub in [&files_dir, &tmp_dir] {
            match std::fs::remove_dir_all(sub) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StoreError::io(sub, e)),
            }
            std::fs::create_dir_all(sub).map_err(|e| StoreError::io(sub, e))?;
        }
        let shared = Arc::new(Shared {
            dir,
            files_dir,
            tmp_dir,
            max_bytes,
            objects: Mutex::new(HashMap::new()),
            next_tmp: AtomicU64::new(0),
            downloads: AtomicU64::new(0),
            download_bytes: AtomicU64::new(0),
            temporary: std::sync::atomic::AtomicBool::new(false),
            _lock: lock,
        });
        let files = Multiplexer::builder()
            .unbounded_models()
            .max_bytes(max_bytes)
            // Our own per-attempt timeouts bound each download; the whole is bounded by them.
            .load_timeout(None)
            .max_concurrent_loads(8)
            .capacity_timeout(Duration::from_secs(60))
            .failure_backoff(Duration::from_secs(1), Duration::from_secs(30))
            .build(FileLoader(shared.clone()));
        Ok(Self { files, shared })
    }

    /// Checks that [`open`](Self::open) would accept `dir`, without changing anything in it:
    /// it is a directory (or does not exist yet), empty or a cache directory of an earlier run,
    /// and no other process holds it.
    pub fn check(dir: impl AsRef<Path>) -> Result<(), StoreError> {
        let dir = dir.as_ref();
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::io(dir, e)),
            Ok(meta) if !meta.is_dir() => {
                return Err(StoreError::Config(format!(
                    "disk cache directory {} is not a directory",
                    dir.display()
                )));
            }
            Ok(_) => {}
        }
        if !dir.join(MARKER).exists() {
            let mut entries = std::fs::read_dir(dir).map_err(|e| StoreError::io(dir, e))?;
            if entries.next().is_some() {
                return Err(StoreError::Config(format!(
                    "disk cache directory {} is not empty and is not a modelmux disk cache; \
                     give the cache a directory of its own (it deletes what it finds there)",
                    dir.display()
                )));
            }
            return Ok(());
        }
        let lock_path = dir.join(".lock");
        if let Ok(lock) = std::fs::File::open(&lock_path)
            && lock.try_lock_shared().is_err()
        {
            return Err(StoreError::Config(format!(
                "disk cache directory {} is in use by another process; give each server its own",
                dir.display()
            )));
        }
        Ok(())
    }

    /// Opens a cache in a new directory under the system's temporary directory, deleted with
    /// everything in it when the last clone of the cache drops.
    pub fn temporary(max_bytes: u64) -> Result<Self, StoreError> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "modelmux-disk-cache-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let cache = Self::open(&dir, max_bytes)?;
        cache.shared.temporary.store(true, Ordering::Relaxed);
        Ok(cache)
    }

    /// The cache's directory.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Counters and occupancy.
    pub fn stats(&self) -> DiskCacheStats {
        let gauges = self.files.gauges();
        DiskCacheStats {
            downloads: self.shared.downloads.load(Ordering::Relaxed),
            download_bytes: self.shared.download_bytes.load(Ordering::Relaxed),
            files: gauges.loaded,
            bytes: gauges.used_bytes,
            max_bytes: self.shared.max_bytes,
        }
    }

    /// Fetches `object`, downloading it unless it is cached, and pins it until the returned
    /// guard drops.
    pub(crate) async fn fetch(&self, object: Object) -> Result<ModelGuard<CachedFile>, StoreError> {
        let key = cache_key(&object);
        let object = {
            let mut objects = self.shared.objects.lock();
            let entry = objects
                .entry(key.clone())
                .or_insert_with(|| (Arc::new(object), 0));
            entry.1 += 1;
            entry.0.clone()
        };
        // Counts this fetch out again even if it is cancelled, and forgets the object once
        // nothing fetches, loads or holds it, so ids that do not exist cost no memory.
        let _fetching = Fetching {
            shared: &self.shared,
            files: &self.files,
            key: &key,
        };
        self.files
            .get(&key)
            .await
            .map_err(|e| store_error(&object, &e))
    }

    /// The size of `object`: from the cache when it is there, else from the store (a `HEAD`,
    /// under the retry policy).
    pub(crate) async fn size(&self, object: Object) -> Result<u64, StoreError> {
        if let Some(file) = self.files.try_get(&cache_key(&object)) {
            return Ok(file.size());
        }
        head_size(&object).await
    }

    /// Drops the cached copy of `object` (a file that downloaded fine but is not a valid
    /// model, say), so the next fetch downloads it again. Readers still holding it keep it
    /// until they are done.
    pub(crate) fn discard(&self, object: &Object) {
        let key = cache_key(object);
        if self.files.evict(&key) {
            tracing::info!(
                model_id = %object.id, file = %object.file, repository = %object.repository,
                "Discarded cached file"
            );
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        if self.temporary.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

struct Fetching<'a> {
    shared: &'a Shared,
    files: &'a Multiplexer<CachedFile>,
    key: &'a ModelId,
}

impl Drop for Fetching<'_> {
    fn drop(&mut self) {
        let mut objects = self.shared.objects.lock();
        let Some(entry) = objects.get_mut(self.key) else {
            return;
        };
        entry.1 -= 1;
        if entry.1 == 0
            && self.files.try_get(self.key).is_none()
            && !self.files.loading_ids().contains(self.key)
        {
            objects.remove(self.key);
        }
    }
}

fn cache_key(object: &Object) -> ModelId {
    let digest = Md5::new()
        .chain_update(object.instance.to_le_bytes())
        .chain_update(object.repository.as_bytes())
        .chain_update([0])
        .chain_update(object.location.as_ref().as_bytes())
        .finalize();
    ModelId::new(hex(&digest)).expect("a hex digest is a valid id")
}

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Turns the file cache's error into the store's, keeping "not found" a "not found".
fn store_error(object: &Object, error: &CacheError) -> StoreError {
    let mut cause = error;
    while let CacheError::BackingOff { cause: inner, .. } = cause {
        cause = inner;
    }
    if let CacheError::LoadFailed { source, .. } = cause
        && let Some(inner) = source.downcast_ref::<StoreError>()
    {
        let mut copy = inner.duplicate();
        if !std::ptr::eq(cause, error)
            && let StoreError::Transfer { last, .. } = &mut copy
        {
            last.push_str(" (failed recently; not retried until its backoff expires)");
        }
        return copy;
    }
    match error {
        CacheError::ModelTooLarge { .. } | CacheError::CapacityExhausted { .. } => {
            StoreError::CacheFull {
                id: object.id.clone(),
                message: error.to_string(),
            }
        }
        other => StoreError::Store {
            id: object.id.clone(),
            repository: object.repository.clone(),
            message: other.to_string(),
        },
    }
}

/// A verified file in the disk cache. Deleted when evicted and no longer read.
pub struct CachedFile {
    path: PathBuf,
    size: u64,
    deleted: bool,
}

impl CachedFile {
    /// Where the file is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Model for CachedFile {
    fn size_bytes(&self) -> Option<u64> {
        Some(self.size)
    }

    async fn unload(mut self) -> Result<(), BoxError> {
        self.deleted = true;
        tokio::fs::remove_file(&self.path).await?;
        Ok(())
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        if !self.deleted {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

struct FileLoader(Arc<Shared>);

impl FileLoader {
    fn object(&self, key: &ModelId) -> Result<Arc<Object>, BoxError> {
        self.0
            .objects
            .lock()
            .get(key)
            .map(|(object, _)| object.clone())
            .ok_or_else(|| format!("disk cache key {key} has no object").into())
    }
}

impl Loader<CachedFile> for FileLoader {
    async fn probe(&self, key: &ModelId) -> Result<Option<u64>, BoxError> {
        let object = self.object(key)?;
        Ok(Some(head_size(&object).await?))
    }

    async fn load(&self, key: &ModelId) -> Result<CachedFile, BoxError> {
        let object = self.object(key)?;
        let started = tokio::time::Instant::now();
        // A name of its own for each download: a reader may still hold an evicted copy of this
        // key, whose deletion must never hit its replacement.
        let final_path = self.0.files_dir.join(format!(
            "{key}.{}",
            self.0.next_tmp.fetch_add(1, Ordering::Relaxed)
        ));
        let size = with_retries(&object, |attempt| {
            let mut tmp = TempFile {
                path: self.0.tmp_dir.join(format!(
                    "{key}.{}.{attempt}.partial",
                    self.0.next_tmp.fetch_add(1, Ordering::Relaxed)
                )),
                writer: None,
                kept: false,
            };
            let object = object.clone();
            let final_path = final_path.clone();
            async move {
                let size = download(&object, &mut tmp).await?;
                // Synchronous (a rename is one metadata operation), so no cancellation can come
                // between the file taking its final name and being kept.
                std::fs::rename(&tmp.path, &final_path)
                    .map_err(|e| Attempt::Local(StoreError::io(&final_path, e)))?;
                tmp.keep();
                Ok(size)
            }
        })
        .await?;
        let elapsed = started.elapsed();
        self.0.downloads.fetch_add(1, Ordering::Relaxed);
        self.0.download_bytes.fetch_add(size, Ordering::Relaxed);
        tracing::info!(
            model_id = %object.id, file = %object.file, repository = %object.repository,
            bytes = size, duration_ms = elapsed.as_millis() as u64,
            mb_per_s = (size as f64 / (1 << 20) as f64 / elapsed.as_secs_f64().max(1e-9)) as u64,
            "Downloaded model file"
        );
        Ok(CachedFile {
            path: final_path,
            size,
            deleted: false,
        })
    }
}

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
struct TempFile {
    path: PathBuf,
    writer: Option<tokio::task::JoinHandle<std::io::Result<u64>>>,
    kept: bool,
}

impl TempFile {
    /// It was renamed into place: leave it.
    fn keep(&mut self) {
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
enum Attempt {
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
async fn with_retries<T, F, Fut>(object: &Object, mut attempt: F) -> Result<T, StoreError>
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
                        message: e.to_string(),
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

/// One download attempt into `tmp`. The body streams to two threads at once: one writes the
/// file, one hashes (when there is a checksum to check), so hashing, writing and receiving
/// overlap. Then size and checksum are checked against the store's word.
async fn download(object: &Object, tmp: &mut TempFile) -> Result<u64, Attempt> {
    let deadline = tokio::time::Instant::now() + object.retry.attempt_timeout;
    let get = object
        .store
        .get_opts(&object.location, object_store::GetOptions::default());
    let result = tokio::time::timeout_at(deadline, get)
        .await
        .map_err(|_| Attempt::Timeout)?
        .map_err(Attempt::Store)?;
    let expected = result.meta.size;
    let expected_md5 = if object.etag_is_md5 {
        result.meta.e_tag.as_deref().and_then(plain_md5_etag)
    } else {
        None
    };
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
    let (to_hasher, hasher) = match expected_md5 {
        Some(_) => {
            let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(64);
            let hasher = tokio::task::spawn_blocking(move || {
                let mut hash = Md5::new();
                while let Some(chunk) = rx.blocking_recv() {
                    hash.update(&chunk);
                }
                <[u8; 16]>::from(hash.finalize())
            });
            (Some(tx), Some(hasher))
        }
        None => (None, None),
    };
    let mut stream = result.into_stream();
    let mut failed = None;
    loop {
        let chunk = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => {
                failed = Some(Attempt::Timeout);
                break;
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                failed = Some(Attempt::Store(e));
                break;
            }
            Ok(Some(Ok(chunk))) => chunk,
        };
        // Sending waits while a thread is behind, so the deadline covers that too. A closed
        // channel means the writer failed; its error is read below.
        let sent = async {
            if let Some(hasher) = &to_hasher
                && hasher.send(chunk.clone()).await.is_err()
            {
                return false;
            }
            to_writer.send(chunk).await.is_ok()
        };
        match tokio::time::timeout_at(deadline, sent).await {
            Ok(true) => {}
            Ok(false) => break,
            Err(_) => {
                failed = Some(Attempt::Timeout);
                break;
            }
        }
    }
    drop((to_writer, to_hasher));
    // Joined in place: if this attempt is cancelled here, the TempFile still owns the writer
    // and removes the file only once the writer has let go of it.
    let joined = tmp.writer.as_mut().expect("set above").await;
    tmp.writer = None;
    let written =
        joined.map_err(|e| Attempt::Local(StoreError::io(&tmp.path, std::io::Error::other(e))))?;
    if let Some(failure) = failed {
        return Err(failure);
    }
    let size = written.map_err(|e| Attempt::Local(StoreError::io(&tmp.path, e)))?;
    if size != expected {
        return Err(Attempt::Verify(format!(
            "the transfer was truncated: {size} of {expected} bytes arrived"
        )));
    }
    if let (Some(expected_md5), Some(hasher)) = (expected_md5, hasher) {
        let md5 = hex(&hasher
            .await
            .map_err(|e| Attempt::Local(StoreError::io(&tmp.path, std::io::Error::other(e))))?);
        if md5 != expected_md5 {
            return Err(Attempt::Verify(format!(
                "the transfer was corrupted: its MD5 {md5} does not match the object's ETag \
                 {expected_md5} (objects encrypted with SSE-KMS or SSE-C have ETags that are \
                 not MD5s: set verify_md5 to false for such buckets)"
            )));
        }
    }
    Ok(size)
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

    #[tokio::test]
    async fn a_directory_with_foreign_files_is_refused_and_a_used_one_is_locked() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious.txt"), b"x").unwrap();
        let err = DiskCache::open(dir.path(), 1 << 20).err().unwrap();
        assert!(err.to_string().contains("not empty"), "{err}");
        assert!(dir.path().join("precious.txt").exists());

        let fresh = dir.path().join("cache");
        let first = DiskCache::open(&fresh, 1 << 20).unwrap();
        let err = DiskCache::open(&fresh, 1 << 20).err().unwrap();
        assert!(err.to_string().contains("in use"), "{err}");
        drop(first);
        // A stale file from an earlier run is removed when the cache opens again.
        std::fs::write(fresh.join("files").join("stale"), b"old").unwrap();
        let _again = DiskCache::open(&fresh, 1 << 20).unwrap();
        assert!(!fresh.join("files").join("stale").exists());
    }
}
