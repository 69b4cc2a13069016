//! `modelmux-store`: model repositories for modelmux.
//!
//! A repository holds one directory per model, `<repository>/<model_id>/<file>`, on local
//! disk or in an object store (S3 and S3-compatible servers with the `s3` feature, any web
//! server with the `http` feature). Remote
//! files are downloaded once into a byte-bounded [`DiskCache`] shared by the whole process,
//! verified, and read from there; downloads are retried on transient errors and bounded in
//! time as a whole ([`RetryPolicy`]).
//!
//! ```no_run
//! use modelmux_cache::ModelId;
//! use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let cache = DiskCache::open("/var/cache/modelmux", 20 << 30)?;
//! let repository = ModelRepository::open(
//!     "s3://my-bucket/models",
//!     RepositoryOptions {
//!         options: vec![("region".into(), "eu-west-1".into())],
//!         disk_cache: Some(cache),
//!         ..Default::default()
//!     },
//! )?;
//! let file = repository.fetch(&ModelId::new("customer-42")?, "model.onnx").await?;
//! let bytes = file.bytes().await?;
//! # drop(bytes);
//! # Ok(())
//! # }
//! ```

mod client;
mod disk;
mod error;
mod file_source;
mod repository;
mod retry;
mod settings;

pub use disk::{CachedFile, DiskCache, DiskCacheStats};
pub use error::StoreError;
pub use file_source::FileSource;
pub use object_store;
pub use repository::{ModelFile, ModelRepository, RepositoryOptions};
pub use retry::RetryPolicy;
pub use settings::{DownloadConfig, OptionValue, is_remote, option_strings};
