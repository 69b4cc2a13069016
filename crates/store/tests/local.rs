//! Repositories that need no server: local directories, and object stores built by the caller
//! (in memory), read through a shared disk cache.

use std::sync::Arc;

use modelmux_cache::ModelId;
use modelmux_store::object_store::memory::InMemory;
use modelmux_store::object_store::path::Path;
use modelmux_store::object_store::{ObjectStoreExt, PutPayload};
use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions, RetryPolicy, StoreError};

fn id(s: &str) -> ModelId {
    ModelId::new(s).unwrap()
}

async fn memory(files: &[(&str, &'static [u8])]) -> Arc<InMemory> {
    let store = Arc::new(InMemory::new());
    for (key, bytes) in files {
        store
            .put(&Path::parse(key).unwrap(), PutPayload::from_static(bytes))
            .await
            .unwrap();
    }
    store
}

#[tokio::test]
async fn a_local_directory_is_read_in_place_and_cannot_be_escaped() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("org/m")).unwrap();
    std::fs::write(dir.path().join("org/m/model.onnx"), b"weights").unwrap();
    std::fs::write(dir.path().join("secret"), b"no").unwrap();
    let repo =
        ModelRepository::open(dir.path().to_str().unwrap(), RepositoryOptions::default()).unwrap();
    let file = repo.fetch(&id("org/m"), "model.onnx").await.unwrap();
    assert_eq!(file.path().unwrap(), dir.path().join("org/m/model.onnx"));
    assert_eq!(&file.bytes().await.unwrap()[..], b"weights");
    assert_eq!(repo.size(&id("org/m"), "model.onnx").await.unwrap(), 7);
    let missing = repo.fetch(&id("org/x"), "model.onnx").await.err().unwrap();
    assert!(missing.is_not_found(), "{missing}");
    for bad in ["..", "org/../..", "/etc"] {
        let err = repo.fetch(&id(bad), "model.onnx").await.err().unwrap();
        assert!(matches!(err, StoreError::InvalidId { .. }), "{bad}: {err}");
    }
    for bad_file in ["../secret", "../../secret", "", "..", "a/b", "/etc/passwd"] {
        let err = repo.fetch(&id("org/m"), bad_file).await.err().unwrap();
        assert!(
            err.to_string().contains("not a file name"),
            "{bad_file}: {err}"
        );
    }
    let url = format!("file://{}", dir.path().display());
    let same = ModelRepository::open(&url, RepositoryOptions::default()).unwrap();
    assert_eq!(same.size(&id("org/m"), "model.onnx").await.unwrap(), 7);
    let err = ModelRepository::open("/no/such/dir", RepositoryOptions::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("/no/such/dir"), "{err}");
}

#[tokio::test]
async fn repositories_sharing_a_disk_cache_never_see_each_others_files() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path().join("c"), 1 << 20).unwrap();
    // Same URL, different contents (different credentials or endpoints look like this).
    let a = memory(&[("m/model.onnx", b"AAAA")]).await;
    let b = memory(&[("m/model.onnx", b"BBBBBB")]).await;
    let repo = |store: Arc<InMemory>| {
        ModelRepository::from_store(
            "mem://models",
            store,
            "",
            Some(cache.clone()),
            RetryPolicy::default(),
        )
        .unwrap()
    };
    let (ra, rb) = (repo(a), repo(b));
    let fa = ra.fetch(&id("m"), "model.onnx").await.unwrap();
    let fb = rb.fetch(&id("m"), "model.onnx").await.unwrap();
    assert_eq!(&fa.bytes().await.unwrap()[..], b"AAAA");
    assert_eq!(&fb.bytes().await.unwrap()[..], b"BBBBBB");
    assert_eq!(cache.stats().downloads, 2);
}

#[tokio::test]
async fn a_discarded_file_still_being_read_never_deletes_its_replacement() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path().join("c"), 1 << 20).unwrap();
    let store = memory(&[("m/model.onnx", b"v1")]).await;
    let repo = ModelRepository::from_store(
        "mem://models",
        store,
        "",
        Some(cache.clone()),
        RetryPolicy::default(),
    )
    .unwrap();
    let old = repo.fetch(&id("m"), "model.onnx").await.unwrap();
    repo.discard(&id("m"), "model.onnx");
    let new = repo.fetch(&id("m"), "model.onnx").await.unwrap();
    assert_ne!(old.path(), new.path());
    let old_path = old.path().unwrap().to_path_buf();
    drop(old);
    // The old copy goes once its reader is done (its unload runs on a task); the new one stays.
    for _ in 0..100 {
        if !old_path.exists() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!old_path.exists());
    assert_eq!(&new.bytes().await.unwrap()[..], b"v1");
    drop(new);
    let again = repo.fetch(&id("m"), "model.onnx").await.unwrap();
    assert_eq!(&again.bytes().await.unwrap()[..], b"v1");
    assert_eq!(cache.stats().downloads, 2);
}

#[tokio::test]
async fn sizes_come_from_the_disk_cache_when_the_file_is_there() {
    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path().join("c"), 1 << 20).unwrap();
    let store = memory(&[("m/model.onnx", b"12345")]).await;
    let repo = ModelRepository::from_store(
        "mem://models",
        store.clone(),
        "",
        Some(cache.clone()),
        RetryPolicy::default(),
    )
    .unwrap();
    let file = repo.fetch(&id("m"), "model.onnx").await.unwrap();
    drop(file);
    // The store loses the object (an outage looks the same): the cached copy still answers.
    store
        .delete(&Path::parse("m/model.onnx").unwrap())
        .await
        .unwrap();
    assert_eq!(repo.size(&id("m"), "model.onnx").await.unwrap(), 5);
    let file = repo.fetch(&id("m"), "model.onnx").await.unwrap();
    assert_eq!(&file.bytes().await.unwrap()[..], b"12345");
    // Without a cache, the store is asked, and says it is gone.
    let direct =
        ModelRepository::from_store("mem://models", store, "", None, RetryPolicy::default())
            .unwrap();
    assert!(
        direct
            .size(&id("m"), "model.onnx")
            .await
            .err()
            .unwrap()
            .is_not_found()
    );
}

#[tokio::test]
async fn listing_names_the_top_level_models_of_a_directory_and_of_an_object_store() {
    let dir = tempfile::tempdir().unwrap();
    for m in ["b", "a", "c"] {
        std::fs::create_dir_all(dir.path().join(m)).unwrap();
        std::fs::write(dir.path().join(m).join("model.onnx"), b"w").unwrap();
    }
    std::fs::write(dir.path().join("README"), b"not a model").unwrap();
    let repo =
        ModelRepository::open(dir.path().to_str().unwrap(), RepositoryOptions::default()).unwrap();
    assert_eq!(
        repo.list(10).await.unwrap(),
        vec![id("a"), id("b"), id("c")]
    );
    assert_eq!(repo.list(2).await.unwrap(), vec![id("a"), id("b")]);

    let store = memory(&[
        ("models/x/model.onnx", b"1"),
        ("models/y/model.onnx", b"2"),
        ("models/loose-file", b"3"),
        ("elsewhere/z/model.onnx", b"4"),
    ])
    .await;
    let repo = ModelRepository::from_store("mem://", store, "models", None, RetryPolicy::default())
        .unwrap();
    assert_eq!(repo.list(10).await.unwrap(), vec![id("x"), id("y")]);
}
