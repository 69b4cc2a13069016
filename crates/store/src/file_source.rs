//! One file a configuration names by location: a local path, or `<repository>/<dir>/<file>`
//! on any store a repository opens (S3, a web server), downloaded into the disk cache by the
//! first fetch. An LLM's GGUF weights come from here.

use std::path::{Path, PathBuf};

use modelmux_cache::ModelId;

use crate::{DiskCache, ModelFile, ModelRepository, RepositoryOptions, RetryPolicy, StoreError};

/// Where one file comes from.
#[derive(Clone)]
pub enum FileSource {
    /// A file on this machine (checked to exist when the source is opened).
    Local(PathBuf),
    /// `file` of entry `id` in `repository`, fetched on demand.
    Remote {
        /// The repository holding it.
        repository: ModelRepository,
        /// Its directory in the repository.
        id: ModelId,
        /// Its name in that directory.
        file: String,
    },
}

impl FileSource {
    /// Opens `location`: a path (or `file://` URL) that must name a file, or a URL
    /// `<repository>/<directory>/<file>` whose repository is opened now (a malformed location
    /// or option is an error here, not at the first fetch).
    pub fn open(
        location: &str,
        options: Vec<(String, String)>,
        disk_cache: Option<&DiskCache>,
        retry: RetryPolicy,
    ) -> Result<Self, StoreError> {
        if !crate::is_remote(location) {
            let path = PathBuf::from(location.strip_prefix("file://").unwrap_or(location));
            if !path.is_file() {
                return Err(StoreError::Config(format!(
                    "{} is not a file",
                    path.display()
                )));
            }
            return Ok(Self::Local(path));
        }
        let bad = || {
            StoreError::Config(format!(
                "'{location}' must be <repository>/<directory>/<file>"
            ))
        };
        let (dir, file) = location.rsplit_once('/').ok_or_else(bad)?;
        let (repository, id) = dir.rsplit_once('/').ok_or_else(bad)?;
        let has_root = repository
            .split_once("://")
            .is_some_and(|(_, root)| !root.is_empty());
        if file.is_empty() || id.is_empty() || !has_root {
            return Err(bad());
        }
        let options = RepositoryOptions {
            options,
            disk_cache: disk_cache.cloned(),
            retry,
            verify_md5: true,
        };
        Ok(Self::Remote {
            repository: ModelRepository::open(repository, options)?,
            id: ModelId::new(id).map_err(|_| bad())?,
            file: file.to_owned(),
        })
    }

    /// The file's path when it is local.
    pub fn local_path(&self) -> Option<&Path> {
        match self {
            Self::Local(path) => Some(path),
            Self::Remote { .. } => None,
        }
    }

    /// The file's path on this machine, downloading it first if it is remote; the download's
    /// handle keeps the cached copy from being evicted while it is held.
    pub async fn fetch(&self) -> Result<(PathBuf, Option<ModelFile>), StoreError> {
        match self {
            Self::Local(path) => Ok((path.clone(), None)),
            Self::Remote {
                repository,
                id,
                file,
            } => {
                let fetched = repository.fetch(id, file).await?;
                let path = fetched.path().map(Path::to_path_buf).ok_or_else(|| {
                    StoreError::Config(format!(
                        "'{file}' of '{id}' was fetched without a local path (a repository \
                         without a disk cache cannot serve whole files)"
                    ))
                })?;
                Ok((path, Some(fetched)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_source_must_be_a_file_and_a_remote_one_a_file_in_a_directory() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let local = FileSource::open(
            file.path().to_str().unwrap(),
            Vec::new(),
            None,
            RetryPolicy::default(),
        )
        .unwrap();
        assert_eq!(local.local_path(), Some(file.path()));
        let missing = FileSource::open("/no/such.gguf", Vec::new(), None, RetryPolicy::default());
        assert!(matches!(missing, Err(StoreError::Config(m)) if m.contains("/no/such.gguf")));
        for bad in ["s3://bucket", "s3://bucket/file.gguf", "s3://bucket/dir/"] {
            let err = FileSource::open(bad, Vec::new(), None, RetryPolicy::default())
                .err()
                .unwrap_or_else(|| panic!("{bad} opened"));
            assert!(
                err.to_string().contains("<repository>/<directory>/<file>"),
                "{bad}: {err}"
            );
        }
    }
}
