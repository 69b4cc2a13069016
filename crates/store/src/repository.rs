//! A model repository: `<repository>/<model_id>/<file>`, on local disk, in S3, or in any
//! `object_store` backend.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use modelmux_cache::{ModelGuard, ModelId};
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, ObjectStore};

use crate::disk::{CachedFile, DiskCache, Object};
use crate::{RetryPolicy, StoreError};

/// Where models are read from, and how.
///
/// - A **local directory** (a plain path or `file:///abs/path`): files are read in place, no
///   copy is made.
/// - A **remote store** (`s3://bucket/prefix` with the `s3` feature, `http(s)://host/path` with
///   the `http` feature): files are downloaded
///   into a [`DiskCache`] and read from there; downloads are retried and bounded in time as
///   [`RetryPolicy`] says.
/// - Any other [`ObjectStore`] given with [`ModelRepository::from_store`] (an in-memory one
///   for embedded models, say), read through the disk cache if one is given, directly if not.
///
/// Model ids may contain `/` but are checked so that `<repository>/<id>/<file>` can never
/// address anything outside the repository.
#[derive(Clone)]
pub struct ModelRepository {
    inner: Arc<Inner>,
}

struct Inner {
    /// Tells this repository's files apart from any other's in a shared disk cache, even one
    /// at the same URL with other credentials or contents.
    instance: u64,
    url: String,
    backend: Backend,
    retry: RetryPolicy,
}

enum Backend {
    Local(PathBuf),
    Store {
        store: Arc<dyn ObjectStore>,
        prefix: ObjectPath,
        cache: Option<DiskCache>,
        etag_is_md5: bool,
    },
}

/// One file of a model, ready to be read. While it lives, a cached copy is not deleted.
pub struct ModelFile {
    source: Source,
    size: u64,
}

enum Source {
    Local(PathBuf),
    Cached(ModelGuard<CachedFile>),
    Memory(Bytes),
}

impl ModelFile {
    /// Its size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Where it is on local disk, unless the store handed it over in memory.
    pub fn path(&self) -> Option<&Path> {
        match &self.source {
            Source::Local(path) => Some(path),
            Source::Cached(file) => Some(file.path()),
            Source::Memory(_) => None,
        }
    }

    /// Reads it whole.
    pub async fn bytes(&self) -> Result<Bytes, StoreError> {
        match &self.source {
            Source::Memory(bytes) => Ok(bytes.clone()),
            Source::Local(path) => read(path).await,
            Source::Cached(file) => read(file.path()).await,
        }
    }
}

async fn read(path: &Path) -> Result<Bytes, StoreError> {
    tokio::fs::read(path)
        .await
        .map(Bytes::from)
        .map_err(|e| StoreError::io(path, e))
}

/// Options for [`ModelRepository::open`].
#[derive(Clone)]
pub struct RepositoryOptions {
    /// Backend options as `object_store` names them, for S3: `endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `session_token`, `allow_http`,
    /// `virtual_hosted_style_request`, ... They override the `AWS_*` environment variables.
    pub options: Vec<(String, String)>,
    /// Where remote models are cached; required for remote repositories.
    pub disk_cache: Option<DiskCache>,
    /// Retries and timeouts of downloads.
    pub retry: RetryPolicy,
    /// Check each S3 download's MD5 against the object's ETag, when the ETag is one (objects
    /// uploaded in one part, without SSE-KMS or SSE-C encryption). Default on; turn it off for
    /// buckets whose ETags are 32 hex digits but not MD5s (SSE-KMS, SSE-C).
    pub verify_md5: bool,
}

impl Default for RepositoryOptions {
    fn default() -> Self {
        Self {
            options: Vec::new(),
            disk_cache: None,
            retry: RetryPolicy::default(),
            verify_md5: true,
        }
    }
}

fn next_instance() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The repository as shown in messages and logs (which clients may see): without user name,
/// password, query or fragment, so no credential in a URL leaks.
fn display_url(location: &str) -> String {
    match url::Url::parse(location) {
        Ok(mut url) => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            url.set_query(None);
            url.set_fragment(None);
            url.as_str().trim_end_matches('/').to_string()
        }
        Err(_) => location.trim_end_matches('/').to_string(),
    }
}

/// Checks a file name of a model: one plain path segment.
fn check_file(file: &str) -> Result<(), StoreError> {
    let bad = file.is_empty()
        || file == "."
        || file == ".."
        || file.contains(['/', '\\'])
        || file.chars().any(char::is_control);
    if bad {
        return Err(StoreError::Config(format!(
            "'{file}' is not a file name inside a model's directory"
        )));
    }
    Ok(())
}

impl ModelRepository {
    /// Opens the repository at `location`: a directory (`models/`, `/srv/models`,
    /// `file:///srv/models`) or a URL (`s3://bucket/prefix`, `https://host/models`).
    pub fn open(location: &str, options: RepositoryOptions) -> Result<Self, StoreError> {
        let RepositoryOptions {
            options,
            disk_cache,
            retry,
            verify_md5,
        } = options;
        let Some((scheme, rest)) = location.split_once("://") else {
            return Self::local(location, &options, retry);
        };
        match scheme {
            "file" => Self::local(rest, &options, retry),
            "s3" | "s3a" | "http" | "https" => {
                let cache = disk_cache.ok_or_else(|| {
                    StoreError::Config(format!(
                        "{location} is remote: a disk cache is needed to download its models into"
                    ))
                })?;
                let (store, prefix, etag_is_md5) = if scheme.starts_with("s3") {
                    let (store, prefix) = s3(location, rest, &options, retry)?;
                    (store, prefix, verify_md5)
                } else {
                    // Web servers' ETags are not content hashes: sizes are checked only.
                    (
                        web(location, &options, retry)?,
                        ObjectPath::default(),
                        false,
                    )
                };
                Ok(Self {
                    inner: Arc::new(Inner {
                        instance: next_instance(),
                        url: display_url(location),
                        backend: Backend::Store {
                            store,
                            prefix,
                            cache: Some(cache),
                            etag_is_md5,
                        },
                        retry,
                    }),
                })
            }
            other => Err(StoreError::Config(format!(
                "unsupported repository scheme '{other}://' in '{location}': use a local path, \
                 file://, s3:// or http(s):// (s3 and http need the crate's features of those names)"
            ))),
        }
    }

    /// A repository on an object store built by the caller (`object_store::memory::InMemory`
    /// for embedded models, a store configured in ways `open` does not offer, ...). `url`
    /// names it in errors and logs. With a disk cache, files are downloaded into it; without
    /// one, they are read into memory directly.
    pub fn from_store(
        url: impl Into<String>,
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        disk_cache: Option<DiskCache>,
        retry: RetryPolicy,
    ) -> Result<Self, StoreError> {
        let url = url.into();
        let prefix = ObjectPath::parse(prefix)
            .map_err(|e| StoreError::Config(format!("invalid prefix '{prefix}' for {url}: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                instance: next_instance(),
                url,
                backend: Backend::Store {
                    store,
                    prefix,
                    cache: disk_cache,
                    etag_is_md5: false,
                },
                retry,
            }),
        })
    }

    fn local(
        path: &str,
        options: &[(String, String)],
        retry: RetryPolicy,
    ) -> Result<Self, StoreError> {
        if let Some((key, _)) = options.first() {
            return Err(StoreError::Config(format!(
                "option '{key}' does not apply to a local repository ({path})"
            )));
        }
        let root = PathBuf::from(path);
        let meta = std::fs::metadata(&root).map_err(|e| StoreError::io(&root, e))?;
        if !meta.is_dir() {
            return Err(StoreError::Config(format!(
                "model repository {} is not a directory",
                root.display()
            )));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                instance: next_instance(),
                url: root.display().to_string(),
                backend: Backend::Local(root),
                retry,
            }),
        })
    }

    /// The repository as configured, for messages.
    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// The size of `file` of model `id`, asking the store without downloading it (`HEAD`).
    /// A missing model is [`StoreError::NotFound`].
    pub async fn size(&self, id: &ModelId, file: &str) -> Result<u64, StoreError> {
        match &self.inner.backend {
            Backend::Local(root) => {
                let path = self.local_path(root, id, file)?;
                match tokio::fs::metadata(&path).await {
                    Ok(meta) if meta.is_file() => Ok(meta.len()),
                    Ok(_) => Err(self.not_found(id, file, &path.display().to_string())),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        Err(self.not_found(id, file, &path.display().to_string()))
                    }
                    Err(e) => Err(StoreError::io(path, e)),
                }
            }
            // A file in the disk cache is not asked about again: loads keep working from
            // disk while the store is down.
            Backend::Store {
                cache: Some(cache), ..
            } => cache.size(self.object(id, file)?).await,
            Backend::Store { cache: None, .. } => {
                crate::disk::head_size(&self.object(id, file)?).await
            }
        }
    }

    /// Opens `file` of model `id`: in place for a local repository, through the disk cache
    /// (downloading it once, however many ask at the same time) for a remote one.
    pub async fn fetch(&self, id: &ModelId, file: &str) -> Result<ModelFile, StoreError> {
        match &self.inner.backend {
            Backend::Local(root) => {
                let path = self.local_path(root, id, file)?;
                let size = self.size(id, file).await?;
                Ok(ModelFile {
                    source: Source::Local(path),
                    size,
                })
            }
            Backend::Store {
                cache: Some(cache), ..
            } => {
                let file = cache.fetch(self.object(id, file)?).await?;
                let size = file.size();
                Ok(ModelFile {
                    source: Source::Cached(file),
                    size,
                })
            }
            Backend::Store {
                store, cache: None, ..
            } => {
                let object = self.object(id, file)?;
                match store
                    .get_opts(&object.location, GetOptions::default())
                    .await
                {
                    Ok(result) => {
                        let bytes = result.bytes().await.map_err(|e| self.store_error(id, e))?;
                        Ok(ModelFile {
                            size: bytes.len() as u64,
                            source: Source::Memory(bytes),
                        })
                    }
                    Err(object_store::Error::NotFound { .. }) => {
                        Err(self.not_found(id, file, object.location.as_ref()))
                    }
                    Err(e) => Err(self.store_error(id, e)),
                }
            }
        }
    }

    /// The ids of the models at the repository's top level (its directories, or the common
    /// prefixes under an object store's prefix), sorted, at most `limit` of them. Nested ids
    /// (`team/model`) are not searched for. A web server cannot list: that is an error.
    pub async fn list(&self, limit: usize) -> Result<Vec<ModelId>, StoreError> {
        let mut ids = match &self.inner.backend {
            Backend::Local(root) => {
                let io = |e| StoreError::io(root, e);
                let mut dir = tokio::fs::read_dir(root).await.map_err(io)?;
                let mut ids = Vec::new();
                while let Some(entry) = dir.next_entry().await.map_err(io)? {
                    if entry.file_type().await.map_err(io)?.is_dir()
                        && let Some(id) = entry
                            .file_name()
                            .to_str()
                            .and_then(|n| ModelId::new(n).ok())
                    {
                        ids.push(id);
                    }
                }
                ids
            }
            Backend::Store { store, prefix, .. } => {
                let listing = tokio::time::timeout(
                    self.inner.retry.attempt_timeout,
                    store.list_with_delimiter(Some(prefix)),
                )
                .await
                .map_err(|_| StoreError::Config(format!("listing {} timed out", self.url())))?
                .map_err(|e| StoreError::Config(format!("listing {}: {e}", self.url())))?;
                listing
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().and_then(|n| ModelId::new(n).ok()))
                    .collect()
            }
        };
        ids.sort();
        ids.truncate(limit);
        Ok(ids)
    }

    /// Forgets the cached copy of `file` of model `id` (one that downloaded fine but turned out
    /// not to be a valid model), so the next fetch downloads it again. A no-op for local
    /// repositories.
    pub fn discard(&self, id: &ModelId, file: &str) {
        if let Backend::Store {
            cache: Some(cache), ..
        } = &self.inner.backend
            && let Ok(object) = self.object(id, file)
        {
            cache.discard(&object);
        }
    }

    fn store_error(&self, id: &ModelId, e: object_store::Error) -> StoreError {
        StoreError::Store {
            id: id.to_string(),
            repository: self.url().to_string(),
            message: crate::client::message(&e),
        }
    }

    fn not_found(&self, id: &ModelId, file: &str, key: &str) -> StoreError {
        StoreError::NotFound {
            id: id.to_string(),
            file: file.to_string(),
            repository: self.url().to_string(),
            key: key.to_string(),
        }
    }

    fn local_path(&self, root: &Path, id: &ModelId, file: &str) -> Result<PathBuf, StoreError> {
        check_file(file)?;
        let relative = id.as_relative_path().map_err(|e| StoreError::InvalidId {
            id: id.to_string(),
            reason: e.to_string(),
        })?;
        Ok(root.join(relative).join(file))
    }

    fn object(&self, id: &ModelId, file: &str) -> Result<Object, StoreError> {
        let Backend::Store {
            store,
            prefix,
            etag_is_md5,
            ..
        } = &self.inner.backend
        else {
            unreachable!("object() is only called for object stores")
        };
        let invalid = |reason: String| StoreError::InvalidId {
            id: id.to_string(),
            reason,
        };
        id.as_relative_path().map_err(|e| invalid(e.to_string()))?;
        check_file(file)?;
        let relative = ObjectPath::parse(format!("{id}/{file}"))
            .map_err(|e| invalid(format!("not a valid object key: {e}")))?;
        let location = prefix.parts().chain(relative.parts()).collect();
        Ok(Object {
            store: store.clone(),
            location,
            repository: self.url().to_string(),
            id: id.to_string(),
            file: file.to_string(),
            etag_is_md5: *etag_is_md5,
            retry: self.inner.retry,
            instance: self.inner.instance,
        })
    }
}

/// Client options shared by the remote backends: our attempt deadline fires first and says so;
/// theirs is the backstop.
#[cfg(any(feature = "s3", feature = "http"))]
fn client_options(retry: RetryPolicy) -> object_store::ClientOptions {
    object_store::ClientOptions::new()
        .with_timeout(retry.attempt_timeout + std::time::Duration::from_secs(5))
        .with_connect_timeout(
            retry
                .attempt_timeout
                .min(std::time::Duration::from_secs(10)),
        )
}

/// One retry policy, ours, which also covers failures in the middle of a body.
#[cfg(any(feature = "s3", feature = "http"))]
fn no_retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 0,
        ..object_store::RetryConfig::default()
    }
}

#[cfg(feature = "http")]
fn web(
    location: &str,
    options: &[(String, String)],
    retry: RetryPolicy,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    use object_store::http::HttpBuilder;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut url = url::Url::parse(location).map_err(|e| {
        StoreError::Config(format!("'{}' is not a URL: {e}", display_url(location)))
    })?;
    if url.query().is_some() || url.fragment().is_some() {
        return Err(StoreError::Config(format!(
            "{}: a repository URL cannot have a query or fragment (model paths are appended to it)",
            display_url(location)
        )));
    }
    // `https://host/models/` and `https://host/models` are the same repository: no `//` in
    // the requests made below it.
    let path = url.path().trim_end_matches('/').to_string();
    url.set_path(&path);
    let mut client = client_options(retry).with_allow_http(url.scheme() == "http");
    for (key, value) in options {
        let parsed: object_store::ClientConfigKey = key.parse().map_err(|_| {
            StoreError::Config(format!(
                "unknown HTTP option '{key}' for {location} (known: allow_invalid_certificates, \
                 proxy_url, and the other object_store client keys)"
            ))
        })?;
        client = client.with_config(parsed, value);
    }
    let store = HttpBuilder::new()
        .with_url(url.as_str())
        .with_http_connector(crate::client::Connector)
        .with_retry(no_retries())
        .with_client_options(client)
        .build()
        .map_err(|e| StoreError::Config(format!("cannot use {location}: {e}")))?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "http"))]
fn web(
    location: &str,
    _: &[(String, String)],
    _: RetryPolicy,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    Err(StoreError::Config(format!(
        "{location}: this build has no HTTP repositories (the `http` feature of modelmux-store)"
    )))
}

#[cfg(feature = "s3")]
fn s3(
    location: &str,
    rest: &str,
    options: &[(String, String)],
    retry: RetryPolicy,
) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StoreError> {
    use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};

    // TLS through rustls on ring (no C toolchain needed); installing it twice is harmless.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(StoreError::Config(format!("no bucket in '{location}'")));
    }
    let prefix = ObjectPath::parse(prefix)
        .map_err(|e| StoreError::Config(format!("invalid prefix in '{location}': {e}")))?;
    let mut builder = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_http_connector(crate::client::Connector)
        .with_retry(no_retries())
        .with_client_options(client_options(retry));
    for (key, value) in options {
        let parsed: AmazonS3ConfigKey = key.parse().map_err(|_| {
            StoreError::Config(format!(
                "unknown S3 option '{key}' for {location} (known: endpoint, region, \
                 access_key_id, secret_access_key, session_token, allow_http, \
                 virtual_hosted_style_request, and the other object_store S3 keys)"
            ))
        })?;
        builder = builder.with_config(parsed, value);
    }
    let store = builder
        .build()
        .map_err(|e| StoreError::Config(format!("cannot use {location}: {e}")))?;
    Ok((Arc::new(store), prefix))
}

#[cfg(not(feature = "s3"))]
fn s3(
    location: &str,
    _: &str,
    _: &[(String, String)],
    _: RetryPolicy,
) -> Result<(Arc<dyn ObjectStore>, ObjectPath), StoreError> {
    Err(StoreError::Config(format!(
        "{location}: this build has no S3 support (the `s3` feature of modelmux-store)"
    )))
}
