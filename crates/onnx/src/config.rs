//! `model: {kind: onnx, ...}`: where the models are and how they are fetched, and the
//! repository they open.

use modelmux_store::{
    DiskCache, DownloadConfig, ModelRepository, OptionValue, RepositoryOptions, StoreError,
};
use serde::Deserialize;

use crate::demo::BUILTIN_DEMO_REPOSITORY;

/// `model: {kind: onnx, ...}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxConfig {
    /// Where the models are: a directory (`examples/models`), `file:///abs/dir`,
    /// `s3://bucket/prefix`, `https://host/path` (any web server), or `builtin://demo` (the
    /// demo models compiled into the binary).
    /// Each model is `<repository>/<model_id>/model.onnx`.
    pub repository: String,
    /// Store options, as `object_store` names them (for S3: `endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `allow_http`, ...). Unset ones come from the
    /// `AWS_*` environment variables.
    #[serde(default)]
    pub options: std::collections::BTreeMap<String, OptionValue>,
    /// Retries and timeouts of downloads from a remote repository.
    #[serde(default)]
    pub download: DownloadConfig,
}

impl OnnxConfig {
    /// Whether the repository is remote (and needs the disk cache).
    pub fn needs_disk_cache(&self) -> bool {
        modelmux_store::is_remote(&self.repository)
    }

    /// Checks the fields together (serde checks each alone).
    pub fn validate(&self) -> Result<(), String> {
        self.download
            .validate()
            .map_err(|e| format!("download: {e}"))
    }

    /// Opens the repository: a malformed location or option is an error now, not at the first
    /// request. Remote repositories download through `disk_cache`; `builtin://demo` is the
    /// demo models compiled into this kind (and takes no options).
    pub async fn repository(
        &self,
        disk_cache: Option<&DiskCache>,
    ) -> Result<ModelRepository, StoreError> {
        if self.repository != BUILTIN_DEMO_REPOSITORY {
            return self.open(disk_cache);
        }
        if !self.options.is_empty() {
            return Err(StoreError::Config(format!(
                "{BUILTIN_DEMO_REPOSITORY} takes no options"
            )));
        }
        crate::demo::repository().await
    }

    /// Opens a repository at a location `object_store` knows (not `builtin://demo`: see
    /// [`repository`](Self::repository)).
    fn open(&self, disk_cache: Option<&DiskCache>) -> Result<ModelRepository, StoreError> {
        ModelRepository::open(
            &self.repository,
            RepositoryOptions {
                options: modelmux_store::option_strings(&self.options),
                disk_cache: disk_cache.cloned(),
                retry: self.download.policy(),
                verify_md5: self.download.verify_md5,
            },
        )
    }
}
