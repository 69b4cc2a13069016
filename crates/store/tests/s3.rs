//! The store and its disk cache against a real S3-compatible server (moto, started by
//! `./scripts/test`), through a proxy that injects faults.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Fault, Proxy, client, files_under, new_bucket, s3_endpoint, upload};
use modelmux_cache::ModelId;
use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions, RetryPolicy, StoreError};

fn id(s: &str) -> ModelId {
    ModelId::new(s).unwrap()
}

/// Deterministic, incompressible-looking bytes.
fn blob(seed: u8, len: usize) -> Vec<u8> {
    let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(seed);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        attempts: 4,
        attempt_timeout: Duration::from_secs(5),
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(100),
    }
}

struct Setup {
    proxy: Proxy,
    repository: ModelRepository,
    cache: DiskCache,
    store: Arc<dyn modelmux_store::object_store::ObjectStore>,
    bucket: String,
    _dir: tempfile::TempDir,
}

async fn setup(name: &str, max_bytes: u64, retry: RetryPolicy) -> Setup {
    let endpoint = s3_endpoint();
    let bucket = new_bucket(&endpoint, name).await;
    let proxy = Proxy::start(&endpoint).await;
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path().join("cache"), max_bytes).unwrap();
    let repository = ModelRepository::open(
        &format!("s3://{bucket}/models"),
        RepositoryOptions {
            options: vec![
                ("endpoint".into(), proxy.endpoint.clone()),
                ("region".into(), "us-east-1".into()),
                ("access_key_id".into(), "test".into()),
                ("secret_access_key".into(), "test".into()),
                ("allow_http".into(), "true".into()),
            ],
            disk_cache: Some(cache.clone()),
            retry,
            verify_md5: true,
        },
    )
    .unwrap();
    let store = client(&endpoint, &bucket);
    Setup {
        proxy,
        repository,
        cache,
        store,
        bucket,
        _dir: dir,
    }
}

impl Setup {
    async fn put(&self, model: &str, bytes: Vec<u8>) {
        upload(&self.store, &format!("models/{model}/model.onnx"), bytes).await;
    }

    /// Fetches `model` and returns the error it must end in.
    async fn fetch_err(&self, model: &str) -> StoreError {
        self.repository
            .fetch(&id(model), "model.onnx")
            .await
            .err()
            .unwrap_or_else(|| panic!("fetching {model} should fail"))
    }

    /// The data files of the cache (not their sidecars) and its temporary files.
    fn cache_files(&self) -> Vec<(std::path::PathBuf, u64)> {
        let mut files = files_under(&self.cache.dir().join("files"));
        files.retain(|(p, _)| p.extension().is_none_or(|e| e != "meta"));
        files.extend(files_under(&self.cache.dir().join("tmp")));
        files
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_fetches_download_once_and_read_the_same_bytes() {
    let s = setup("once", 64 << 20, fast_retries()).await;
    let bytes = blob(1, 3 << 20);
    s.put("m", bytes.clone()).await;
    assert_eq!(
        s.repository.size(&id("m"), "model.onnx").await.unwrap(),
        3 << 20
    );
    let fetches = (0..16).map(|_| {
        let repository = s.repository.clone();
        tokio::spawn(async move {
            let file = repository.fetch(&id("m"), "model.onnx").await.unwrap();
            (file.size(), file.bytes().await.unwrap())
        })
    });
    for fetch in futures_util::future::join_all(fetches).await {
        let (size, got) = fetch.unwrap();
        assert_eq!(size, 3 << 20);
        assert!(got == bytes, "the cached copy is the object");
    }
    assert_eq!(
        s.proxy.gets("/m/model.onnx"),
        1,
        "one download for 16 fetches"
    );
    let stats = s.cache.stats();
    assert_eq!((stats.downloads, stats.download_bytes), (1, 3 << 20));
    // Later fetches are served from disk.
    s.repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert_eq!(s.proxy.gets("/m/model.onnx"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_disk_cache_stays_within_its_byte_bound() {
    let max = 1 << 20;
    let s = setup("bound", max, fast_retries()).await;
    for i in 0..6u8 {
        s.put(&format!("m{i}"), blob(i, 300 << 10)).await;
    }
    for round in 0..2 {
        for i in 0..6u8 {
            let file = s
                .repository
                .fetch(&id(&format!("m{i}")), "model.onnx")
                .await
                .unwrap();
            assert!(file.bytes().await.unwrap() == blob(i, 300 << 10));
            drop(file);
            let on_disk: u64 = s.cache_files().iter().map(|(_, len)| len).sum();
            let stats = s.cache.stats();
            assert!(
                stats.bytes <= max && on_disk <= max,
                "round {round}: {stats:?}, {on_disk} on disk"
            );
            assert!(stats.files <= 3);
        }
    }
    // Cycling 6 models through room for 3 evicts every time (LRU): 12 downloads.
    assert_eq!(s.cache.stats().downloads, 12);
    // A model larger than the whole cache is refused, and nothing is evicted for it.
    s.put("huge", blob(9, 2 << 20)).await;
    let before = s.cache.stats().files;
    let err = s.fetch_err("huge").await;
    assert!(matches!(err, StoreError::CacheFull { .. }), "{err}");
    assert_eq!(s.cache.stats().files, before);
    assert_eq!(
        s.proxy.gets("/huge/model.onnx"),
        0,
        "refused before downloading"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_file_is_not_deleted_until_its_reader_is_done() {
    let s = setup("pinned", 1 << 20, fast_retries()).await;
    s.put("a", blob(1, 600 << 10)).await;
    s.put("b", blob(2, 600 << 10)).await;
    let a = s.repository.fetch(&id("a"), "model.onnx").await.unwrap();
    // No room for b while a is read: b waits (bounded), a's file stays intact.
    let repository = s.repository.clone();
    let b = tokio::spawn(async move { repository.fetch(&id("b"), "model.onnx").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!b.is_finished());
    assert!(a.bytes().await.unwrap() == blob(1, 600 << 10));
    let path = a.path().unwrap().to_path_buf();
    drop(a);
    let b = b.await.unwrap().unwrap();
    assert!(b.bytes().await.unwrap() == blob(2, 600 << 10));
    assert!(!path.exists(), "a was evicted once its reader was done");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_errors_are_retried_until_the_attempts_run_out() {
    let s = setup("retry", 16 << 20, fast_retries()).await;
    s.put("m", blob(3, 100 << 10)).await;
    s.proxy
        .inject(&[Fault::Status(503), Fault::Status(500)], None);
    let file = s.repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert!(file.bytes().await.unwrap() == blob(3, 100 << 10));
    assert_eq!(
        s.proxy.gets("/m/model.onnx"),
        3,
        "two failures, then success"
    );

    s.put("n", blob(4, 100 << 10)).await;
    s.proxy.inject(&[], Some(Fault::Status(503)));
    let err = s.fetch_err("n").await;
    assert!(
        matches!(err, StoreError::Transfer { attempts: 4, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("after 4 attempt(s)"), "{err}");
    assert_eq!(s.proxy.gets("/n/model.onnx"), 4);
    assert!(
        s.cache_files()
            .iter()
            .all(|(p, _)| p == file.path().unwrap())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_transfer_is_cut_off_by_the_attempt_timeout() {
    let retry = RetryPolicy {
        attempt_timeout: Duration::from_millis(700),
        ..fast_retries()
    };
    let s = setup("stall", 16 << 20, retry).await;
    s.put("m", blob(5, 1 << 20)).await;
    // The first attempt stalls half-way through the body; the second completes.
    s.proxy.inject(&[Fault::Stall], None);
    let started = tokio::time::Instant::now();
    let file = s.repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert!(file.bytes().await.unwrap() == blob(5, 1 << 20));
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(s.proxy.gets("/m/model.onnx"), 2);
    drop(file);

    // Always stalling: every attempt times out, and nothing is left behind.
    s.put("n", blob(6, 1 << 20)).await;
    s.proxy.inject(&[], Some(Fault::Stall));
    let err = s.fetch_err("n").await;
    assert!(
        err.to_string()
            .contains("did not finish within its timeout"),
        "{err}"
    );
    assert_eq!(s.proxy.gets("/n/model.onnx"), 4);
    assert!(files_under(&s.cache.dir().join("tmp")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_corrupted_transfers_are_refused_and_leave_nothing() {
    let retry = RetryPolicy {
        attempts: 2,
        ..fast_retries()
    };
    let s = setup("verify", 16 << 20, retry).await;
    s.put("t", blob(7, 512 << 10)).await;
    s.proxy.inject(&[], Some(Fault::Truncate));
    let err = s.fetch_err("t").await;
    assert!(
        matches!(err, StoreError::Transfer { attempts: 2, .. }),
        "{err}"
    );
    assert!(s.cache_files().is_empty(), "{:?}", s.cache_files());

    s.put("c", blob(8, 512 << 10)).await;
    s.proxy.inject(&[], Some(Fault::Corrupt));
    let err = s.fetch_err("c").await;
    assert!(
        err.to_string().contains("does not match the object's ETag"),
        "{err}"
    );
    assert!(s.cache_files().is_empty(), "{:?}", s.cache_files());

    // Once the network behaves (and the failure's backoff has passed), both load fine.
    s.proxy.inject(&[], None);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (m, seed) in [("t", 7), ("c", 8)] {
        let file = s.repository.fetch(&id(m), "model.onnx").await.unwrap();
        assert!(file.bytes().await.unwrap() == blob(seed, 512 << 10));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_model_is_a_clear_error_not_retried_and_not_remembered_past_the_backoff() {
    let s = setup("missing", 16 << 20, fast_retries()).await;
    let err = s.fetch_err("ghost").await;
    assert!(err.is_not_found(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&format!(
            "model 'ghost' not found in s3://{}/models",
            s.bucket
        )),
        "{message}"
    );
    assert_eq!(s.proxy.heads(), 1, "a 404 is not retried");
    assert_eq!(s.proxy.gets("ghost/model.onnx"), 0, "nothing is downloaded");
    // Within the backoff, the failure is remembered: the store is not asked again.
    let again = s.fetch_err("ghost").await;
    assert!(again.is_not_found(), "{again}");
    assert_eq!(s.proxy.heads(), 1);
    // Uploaded later, it is found once the backoff has passed.
    s.put("ghost", blob(9, 1000)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let file = s
        .repository
        .fetch(&id("ghost"), "model.onnx")
        .await
        .unwrap();
    assert_eq!(file.size(), 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_is_not_retried() {
    let s = setup("denied", 16 << 20, fast_retries()).await;
    s.put("m", blob(1, 1000)).await;
    s.proxy.inject(&[], Some(Fault::Status(403)));
    let err = s.fetch_err("m").await;
    assert!(matches!(err, StoreError::PermissionDenied { .. }), "{err}");
    assert_eq!(s.proxy.gets("/m/model.onnx"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_heads_are_retried_too() {
    let s = setup("head", 16 << 20, fast_retries()).await;
    s.put("m", blob(1, 1000)).await;
    s.proxy.inject_head(&[503, 500]);
    assert_eq!(
        s.repository.size(&id("m"), "model.onnx").await.unwrap(),
        1000
    );
    assert_eq!(s.proxy.heads(), 3);
    s.proxy.inject_head(&[503]);
    let file = s.repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert_eq!(file.size(), 1000);
    // Once cached, its size comes from the disk: the store is not asked.
    let heads = s.proxy.heads();
    s.proxy.inject_head(&[503, 503, 503, 503, 503]);
    assert_eq!(
        s.repository.size(&id("m"), "model.onnx").await.unwrap(),
        1000
    );
    assert_eq!(s.proxy.heads(), heads);
}

#[tokio::test]
async fn ids_cannot_leave_the_repository() {
    let s = setup("escape", 16 << 20, fast_retries()).await;
    for bad in ["../x", "a/../../b", "/abs", "a\\b", "a//b"] {
        let err = s.fetch_err(bad).await;
        assert!(matches!(err, StoreError::InvalidId { .. }), "{bad}: {err}");
    }
    assert_eq!(
        s.proxy.heads() + s.proxy.gets(""),
        0,
        "nothing was asked of the store"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_uses_kept_files_again_only_while_their_source_and_checksum_verify() {
    let s = setup("kept", 64 << 20, fast_retries()).await;
    let first = blob(7, 2 << 20);
    s.put("m", first.clone()).await;
    s.put("other", blob(8, 1 << 20)).await;
    s.repository.fetch(&id("m"), "model.onnx").await.unwrap();
    s.repository
        .fetch(&id("other"), "model.onnx")
        .await
        .unwrap();
    assert_eq!(s.proxy.gets("/m/model.onnx"), 1);
    let dir = s.cache.dir().to_path_buf();
    // A restart: the first cache lets go of its directory, and the cache and the repository
    // are opened again on it.
    let Setup {
        proxy,
        repository,
        cache,
        store,
        bucket,
        _dir,
    } = s;
    drop((repository, cache));
    let s = SetupLite {
        proxy,
        store,
        bucket,
        _dir,
    };
    let (cache, repository) = reopen_with(&s, &dir);
    let file = repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert!(
        file.bytes().await.unwrap() == first,
        "the kept file is the object"
    );
    assert_eq!(s.proxy.gets("/m/model.onnx"), 1, "used again: no download");
    assert_eq!(cache.stats().downloads, 0);
    drop((file, repository, cache));

    // The object changed at its source: downloaded again.
    let second = blob(9, 2 << 20);
    upload(&s.store, "models/m/model.onnx", second.clone()).await;
    let (cache, repository) = reopen_with(&s, &dir);
    let file = repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert!(file.bytes().await.unwrap() == second);
    assert_eq!(s.proxy.gets("/m/model.onnx"), 2);
    drop((file, repository, cache));

    // The kept file was damaged on disk (same size): its checksum fails, downloaded again.
    let kept: Vec<_> = files_under(&dir.join("files"))
        .into_iter()
        .filter(|(p, size)| *size == 2 << 20 && p.extension().is_none_or(|e| e != "meta"))
        .collect();
    assert_eq!(kept.len(), 1, "{kept:?}");
    let mut damaged = std::fs::read(&kept[0].0).unwrap();
    damaged[1000] ^= 0xff;
    std::fs::write(&kept[0].0, damaged).unwrap();
    let (cache, repository) = reopen_with(&s, &dir);
    let file = repository.fetch(&id("m"), "model.onnx").await.unwrap();
    assert!(file.bytes().await.unwrap() == second);
    assert_eq!(s.proxy.gets("/m/model.onnx"), 3);
    assert_eq!(cache.stats().downloads, 1);
    // A file with no sidecar is not trusted: deleted at open.
    drop((file, repository, cache));
    std::fs::write(dir.join("files").join("stray.bin"), b"who wrote this?").unwrap();
    let (cache, _repository) = reopen_with(&s, &dir);
    assert!(!dir.join("files").join("stray.bin").exists());
    drop(cache);
}

/// What a restart keeps of a [`Setup`]: the server side.
struct SetupLite {
    proxy: Proxy,
    store: Arc<dyn modelmux_store::object_store::ObjectStore>,
    bucket: String,
    _dir: tempfile::TempDir,
}

/// The cache and repository opened again on `dir`. The previous cache on `dir` lets go of the
/// directory once the files it held are put away, which its last handle's drop starts in the
/// background: until then the directory is in use, and opening it is retried (as a restarted
/// server's process would not need to: the old one has exited).
fn reopen_with(s: &SetupLite, dir: &std::path::Path) -> (DiskCache, ModelRepository) {
    let mut attempts = 0;
    let cache = loop {
        attempts += 1;
        match DiskCache::open(dir, 64 << 20) {
            Ok(cache) => break cache,
            // 20 ms apart, for up to 10 s.
            Err(e) if e.to_string().contains("in use") && attempts < 500 => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("reopening the disk cache: {e}"),
        }
    };
    let repository = ModelRepository::open(
        &format!("s3://{}/models", s.bucket),
        RepositoryOptions {
            options: vec![
                ("endpoint".into(), s.proxy.endpoint.clone()),
                ("region".into(), "us-east-1".into()),
                ("access_key_id".into(), "test".into()),
                ("secret_access_key".into(), "test".into()),
                ("allow_http".into(), "true".into()),
            ],
            disk_cache: Some(cache.clone()),
            retry: fast_retries(),
            verify_md5: true,
        },
    )
    .unwrap();
    (cache, repository)
}
