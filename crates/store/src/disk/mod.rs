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
//! name. A directory of an earlier run keeps its verified files (`kept.rs`): each is used again
//! only when its object is unchanged (size and ETag by a `HEAD`) and its bytes still hash to
//! what was downloaded; anything else there is deleted. A lock file keeps two processes from
//! sharing one directory.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use md5::{Digest, Md5};
use modelmux_cache::{
    BoxError, Error as CacheError, Loader, Model, ModelGuard, ModelId, Multiplexer,
};
use object_store::ObjectStore;
use object_store::path::Path as ObjectPath;
use parking_lot::Mutex;

use crate::StoreError;
use crate::retry::{Failure, RetryPolicy, classify};

mod dir;
mod download;
mod kept;
mod progress;

pub(crate) use download::head_size;
use download::{Attempt, TempFile, download, with_retries};

const MARKER: &str = ".modelmux-disk-cache";

/// A byte-bounded cache of downloaded model files in a local directory, shared by every
/// repository (and every replica) of a process that is given it. Cloning shares it.
#[derive(Clone)]
pub struct DiskCache {
    // First, so it drops first: the files are unloaded after it says the cache is closing.
    _lifetime: Arc<Lifetime>,
    files: Multiplexer<CachedFile>,
    shared: Arc<Shared>,
}

/// Marks the cache closing when its last handle goes: the files it still holds are then left
/// on disk for the next run, not deleted as evicted files are.
struct Lifetime(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Lifetime {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
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
    /// Files of an earlier run not used again yet.
    kept: kept::KeptFiles,
    /// Bytes of the files the cache holds (kept ones once used again included).
    live_bytes: Arc<AtomicU64>,
    /// Set once the last handle is gone.
    closing: Arc<std::sync::atomic::AtomicBool>,
    /// This run's mark in file names: files kept from earlier runs never share a name with
    /// this run's downloads (keys and counters repeat across runs).
    run: u64,
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
    /// `dir` is created if needed, private (`0700`). An existing one must be owned by this
    /// process's user and writable by no one else (another account could plant model files
    /// in it), and be empty or a cache directory from an earlier run, whose verified files are
    /// kept for fetches of the same, unchanged objects (the rest is deleted); no other process
    /// may be using it. Must be called inside a Tokio runtime.
    pub fn open(dir: impl Into<PathBuf>, max_bytes: u64) -> Result<Self, StoreError> {
        let dir = dir.into();
        dir::prepare(&dir)?;
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
                b"modelmux disk cache: files are checked against their source before use\n",
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
        match std::fs::remove_dir_all(&tmp_dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(StoreError::io(&tmp_dir, e)),
        }
        for sub in [&files_dir, &tmp_dir] {
            dir::create_sub(sub)?;
        }
        let kept = kept::KeptFiles::scan(&files_dir, max_bytes);
        if kept.bytes() > 0 {
            tracing::info!(dir = %dir.display(), bytes = kept.bytes(), "disk cache: files of an earlier run kept, to be checked against their source before use");
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
            kept,
            live_bytes: Arc::default(),
            closing: Arc::default(),
            run: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
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
        Ok(Self {
            _lifetime: Arc::new(Lifetime(shared.closing.clone())),
            files,
            shared,
        })
    }

    /// Checks that [`open`](Self::open) would accept `dir`, without changing anything in it:
    /// it is a directory (or does not exist yet) of this user's that no one else may write,
    /// empty or a cache directory of an earlier run, and no other process holds it.
    pub fn check(dir: impl AsRef<Path>) -> Result<(), StoreError> {
        let dir = dir.as_ref();
        match std::fs::metadata(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError::io(dir, e)),
            Ok(_) => dir::check_existing(dir)?,
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

    /// Opens a cache in a new private directory (`0700`, an unpredictable name) under the
    /// system's temporary directory, deleted with everything in it when the last clone of the
    /// cache drops.
    pub fn temporary(max_bytes: u64) -> Result<Self, StoreError> {
        let dir = dir::temporary()?;
        match Self::open(&dir, max_bytes) {
            Ok(cache) => {
                cache.shared.temporary.store(true, Ordering::Relaxed);
                Ok(cache)
            }
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(e)
            }
        }
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
    /// The cache's count of bytes held.
    live: Arc<AtomicU64>,
    /// Whether the cache is closing (its files stay for the next run).
    closing: Arc<std::sync::atomic::AtomicBool>,
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
        if self.closing.load(Ordering::SeqCst) {
            // Not evicted: the cache is closing, and its files are the next run's.
            return Ok(());
        }
        let _ = tokio::fs::remove_file(kept::sidecar(&self.path)).await;
        tokio::fs::remove_file(&self.path).await?;
        Ok(())
    }
}

impl Drop for CachedFile {
    fn drop(&mut self) {
        self.live.fetch_sub(self.size, Ordering::Relaxed);
        if !self.deleted && !self.closing.load(Ordering::SeqCst) {
            kept::remove(&self.path);
        }
    }
}

impl Shared {
    /// The cache's entry for the verified file at `path`.
    fn file(&self, path: PathBuf, size: u64) -> CachedFile {
        self.live_bytes.fetch_add(size, Ordering::Relaxed);
        CachedFile {
            path,
            size,
            deleted: false,
            live: self.live_bytes.clone(),
            closing: self.closing.clone(),
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
        let size = head_size(&object).await?;
        // Files of an earlier run not used yet give way to this one within the byte bound.
        let used = self.0.live_bytes.load(Ordering::Relaxed);
        self.0.kept.make_room(used, size, self.0.max_bytes, &object);
        Ok(Some(size))
    }

    async fn load(&self, key: &ModelId) -> Result<CachedFile, BoxError> {
        let object = self.object(key)?;
        if let Some((path, size)) = self.0.kept.take(&object).await {
            tracing::info!(
                model_id = %object.id, file = %object.file, repository = %object.repository,
                bytes = size, "Using model file kept from an earlier run (unchanged at its source, checksum verified)"
            );
            return Ok(self.0.file(path, size));
        }
        let started = tokio::time::Instant::now();
        // A name of its own for each download: a reader may still hold an evicted copy of this
        // key, whose deletion must never hit its replacement (nor may a file kept from an
        // earlier run).
        let final_path = self.0.files_dir.join(format!(
            "{key}.{:x}.{}",
            self.0.run,
            self.0.next_tmp.fetch_add(1, Ordering::Relaxed)
        ));
        let downloaded = with_retries(&object, |attempt| {
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
                let downloaded = download(&object, &mut tmp).await?;
                // Synchronous (a rename is one metadata operation), so no cancellation can come
                // between the file taking its final name and being kept.
                std::fs::rename(&tmp.path, &final_path)
                    .map_err(|e| Attempt::Local(StoreError::io(&final_path, e)))?;
                tmp.keep();
                Ok(downloaded)
            }
        })
        .await?;
        let size = downloaded.size;
        kept::write_sidecar(
            &final_path,
            &kept::Record {
                repository: object.repository.clone(),
                location: object.location.as_ref().to_string(),
                size,
                etag: downloaded.etag,
                md5: downloaded.md5,
            },
        );
        let elapsed = started.elapsed();
        self.0.downloads.fetch_add(1, Ordering::Relaxed);
        self.0.download_bytes.fetch_add(size, Ordering::Relaxed);
        tracing::info!(
            model_id = %object.id, file = %object.file, repository = %object.repository,
            bytes = size, duration_ms = elapsed.as_millis() as u64,
            mb_per_s = (size as f64 / (1 << 20) as f64 / elapsed.as_secs_f64().max(1e-9)) as u64,
            "Downloaded model file"
        );
        Ok(self.0.file(final_path, size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
