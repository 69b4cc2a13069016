//! Files kept from an earlier run of the same cache directory. Each verified download leaves a
//! sidecar (`<file>.meta`: where it came from, its size, the object's ETag and the file's MD5).
//! When the cache opens, files with a readable sidecar and the size it records are kept (the
//! most recently written first, within the byte bound); everything else is deleted. A kept file
//! is used again only by a fetch of the same object whose `HEAD` still shows its size and
//! ETag, and only once its bytes still hash to the recorded MD5; otherwise it is deleted and
//! the object downloaded again. Until a fetch uses it, a kept file is outside the cache's
//! accounting, so downloads delete kept files first when they would pass the byte bound.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use md5::{Digest, Md5};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::Object;

/// What a sidecar records.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(super) struct Record {
    pub(super) repository: String,
    pub(super) location: String,
    pub(super) size: u64,
    pub(super) etag: Option<String>,
    pub(super) md5: String,
}

/// The sidecar of data file `path`.
pub(super) fn sidecar(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".meta");
    PathBuf::from(name)
}

/// Writes `record` beside `path` (best effort: without it the file is simply not kept).
pub(super) fn write_sidecar(path: &Path, record: &Record) {
    let json = serde_json::to_vec(record).expect("a record is plain JSON");
    let meta = sidecar(path);
    let tmp = meta.with_extension("meta.partial");
    if std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, &meta))
        .is_err()
    {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Deletes a data file and its sidecar.
pub(super) fn remove(path: &Path) {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(sidecar(path));
}

struct Kept {
    path: PathBuf,
    record: Record,
    /// When it was written (the oldest goes first).
    written: std::time::SystemTime,
}

/// The files kept from an earlier run, by (repository, location).
#[derive(Default)]
pub(super) struct KeptFiles {
    files: Mutex<HashMap<(String, String), Kept>>,
}

impl KeptFiles {
    /// Reads `files_dir`: keeps the files with a sidecar that matches them, the newest first,
    /// while they fit in `max_bytes`; deletes the rest.
    pub(super) fn scan(files_dir: &Path, max_bytes: u64) -> Self {
        let mut found: Vec<Kept> = Vec::new();
        let mut data_files = Vec::new();
        for entry in std::fs::read_dir(files_dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "meta") {
                continue;
            }
            data_files.push(path);
        }
        for path in data_files {
            let record = std::fs::read(sidecar(&path))
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok());
            let meta = std::fs::metadata(&path).ok();
            match (record, meta) {
                (Some(record), Some(meta)) if meta.is_file() && meta.len() == record.size => {
                    let written = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    found.push(Kept {
                        path,
                        record,
                        written,
                    });
                }
                _ => remove(&path),
            }
        }
        // Sidecars whose file is gone.
        for entry in std::fs::read_dir(files_dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "meta") && !path.with_extension("").exists() {
                let _ = std::fs::remove_file(&path);
            }
        }
        found.sort_by_key(|kept| std::cmp::Reverse(kept.written));
        let mut total = 0u64;
        let mut files = HashMap::new();
        for kept in found {
            let key = (kept.record.repository.clone(), kept.record.location.clone());
            if total + kept.record.size > max_bytes || files.contains_key(&key) {
                remove(&kept.path);
                continue;
            }
            total += kept.record.size;
            files.insert(key, kept);
        }
        Self {
            files: Mutex::new(files),
        }
    }

    /// Bytes of the kept files not used again yet.
    pub(super) fn bytes(&self) -> u64 {
        self.files.lock().values().map(|k| k.record.size).sum()
    }

    /// Deletes kept files (the oldest first, by when they were kept) until `bytes` more fit
    /// beside `used` under `max_bytes`, or none is left but `object`'s own (about to be used
    /// again, or replaced).
    pub(super) fn make_room(&self, used: u64, bytes: u64, max_bytes: u64, object: &Object) {
        let own = (
            object.repository.clone(),
            object.location.as_ref().to_string(),
        );
        let mut files = self.files.lock();
        loop {
            let others: u64 = files
                .iter()
                .filter(|(key, _)| **key != own)
                .map(|(_, k)| k.record.size)
                .sum();
            if others == 0 || used + bytes + others <= max_bytes {
                return;
            }
            let oldest = files
                .iter()
                .filter(|(key, _)| **key != own)
                .min_by_key(|(_, k)| k.written)
                .map(|(key, _)| key.clone())
                .expect("others is not empty");
            if let Some(k) = files.remove(&oldest) {
                remove(&k.path);
            }
        }
    }

    /// The kept file of `object`, if it is still the object's bytes: the object's size and
    /// ETag (a `HEAD`) and the file's MD5 must all be the recorded ones. Taken out of the kept
    /// set either way (a file that no longer verifies is deleted).
    pub(super) async fn take(&self, object: &Object) -> Option<(PathBuf, u64)> {
        let key = (
            object.repository.clone(),
            object.location.as_ref().to_string(),
        );
        let kept = self.files.lock().remove(&key)?;
        let head = object_store::GetOptions::new().with_head(true);
        let fresh = match tokio::time::timeout(
            object.retry.attempt_timeout,
            object.store.get_opts(&object.location, head),
        )
        .await
        {
            Ok(Ok(result)) => {
                result.meta.size == kept.record.size && result.meta.e_tag == kept.record.etag
            }
            _ => false,
        };
        let path = kept.path.clone();
        let intact = fresh
            && tokio::task::spawn_blocking(move || md5_of(&path))
                .await
                .ok()
                .flatten()
                .is_some_and(|md5| md5 == kept.record.md5);
        if intact {
            Some((kept.path, kept.record.size))
        } else {
            remove(&kept.path);
            None
        }
    }
}

/// The MD5 of the file at `path`, as hex.
fn md5_of(path: &Path) -> Option<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).ok()?;
    let mut hash = Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    Some(super::hex(&hash.finalize()))
}
