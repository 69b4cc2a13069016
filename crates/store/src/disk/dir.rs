//! The cache directory itself: made private, and never adopted from another account.
//!
//! Whoever can write the cache directory can plant a model the server then loads (a kept file
//! is checked against values its sidecar holds), swap a file after it is verified, or hold the
//! lock. So a directory the cache creates is `0700`; an existing one is used only when this
//! process's user owns it and neither its group nor others may write it (nor its `files/`).
//! The temporary cache is a new directory with an unpredictable name (`tempfile`'s, created
//! with `mkdir`, which fails on a name that exists; mode `0700` asked for explicitly, as
//! `tempfile` leaves directories at the umask's default), never a name another user could
//! create first.

use std::path::{Path, PathBuf};

use crate::StoreError;

/// Makes `dir` ready for the cache: creates it (`0700`, its missing parents with the usual
/// mode) if it does not exist, else checks that it is safe to use ([`check_existing`]).
pub(super) fn prepare(dir: &Path) -> Result<(), StoreError> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|e| StoreError::io(parent, e))?;
    }
    match private_builder().create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => check_existing(dir),
        Err(e) => Err(StoreError::io(dir, e)),
    }
}

/// Creates the cache's own subdirectory `sub` (`0700`) if it is missing.
pub(super) fn create_sub(sub: &Path) -> Result<(), StoreError> {
    match private_builder().create(sub) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => check_existing(sub),
        Err(e) => Err(StoreError::io(sub, e)),
    }
}

/// A new private directory (`0700`, an unpredictable name) under the system's temporary
/// directory, for a cache deleted when it closes.
pub(super) fn temporary() -> Result<PathBuf, StoreError> {
    let base = std::env::temp_dir();
    let mut builder = tempfile::Builder::new();
    builder.prefix("modelmux-disk-cache-");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o700));
    }
    builder
        .tempdir_in(&base)
        .map(tempfile::TempDir::keep)
        .map_err(|e| StoreError::io(&base, e))
}

/// Checks that the existing `dir` is a directory this process's user owns and that no one
/// else may write: one another account made, or may change, is refused, never adopted.
pub(super) fn check_existing(dir: &Path) -> Result<(), StoreError> {
    let meta = std::fs::metadata(dir).map_err(|e| StoreError::io(dir, e))?;
    if !meta.is_dir() {
        return Err(StoreError::Config(format!(
            "disk cache directory {} is not a directory",
            dir.display()
        )));
    }
    check_private(dir, &meta)
}

#[cfg(unix)]
fn private_builder() -> std::fs::DirBuilder {
    use std::os::unix::fs::DirBuilderExt;
    let mut builder = std::fs::DirBuilder::new();
    builder.mode(0o700);
    builder
}

#[cfg(not(unix))]
fn private_builder() -> std::fs::DirBuilder {
    std::fs::DirBuilder::new()
}

#[cfg(unix)]
fn check_private(dir: &Path, meta: &std::fs::Metadata) -> Result<(), StoreError> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(StoreError::Config(format!(
            "disk cache directory {} is owned by another user (uid {}, this process runs as uid \
             {me}); the cache never adopts a directory another account made: give it one of \
             its own",
            dir.display(),
            meta.uid()
        )));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(StoreError::Config(format!(
            "disk cache directory {} is writable by its group or by others (mode {mode:04o}); \
             another account could plant or swap model files there: make it private \
             (chmod 700) or give the cache a new directory",
            dir.display()
        )));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_private(_dir: &Path, _meta: &std::fs::Metadata) -> Result<(), StoreError> {
    Ok(())
}

#[cfg(all(test, unix))]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use crate::DiskCache;

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[tokio::test]
    async fn a_world_writable_or_foreign_directory_is_refused_and_a_new_one_is_private() {
        let base = tempfile::tempdir().unwrap();
        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        for err in [
            DiskCache::open(&open, 1 << 20).err().unwrap(),
            DiskCache::check(&open).unwrap_err(),
        ] {
            let message = err.to_string();
            assert!(
                message.contains("writable by its group or by others"),
                "{message}"
            );
            assert!(message.contains("0777"), "{message}");
        }
        // Refused before anything is written there.
        assert_eq!(std::fs::read_dir(&open).unwrap().count(), 0);

        // Group-writable is refused too.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(DiskCache::open(&open, 1 << 20).is_err());

        if nix::unistd::geteuid().is_root() {
            // Root may make a directory another account owns: refused all the same.
            let foreign = base.path().join("foreign");
            std::fs::create_dir(&foreign).unwrap();
            std::os::unix::fs::chown(&foreign, Some(65534), Some(65534)).unwrap();
            let err = DiskCache::open(&foreign, 1 << 20).err().unwrap();
            assert!(err.to_string().contains("owned by another user"), "{err}");
        }

        // A directory the cache creates (parents included) is private.
        let fresh = base.path().join("a").join("cache");
        let cache = DiskCache::open(&fresh, 1 << 20).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        assert_eq!(mode(&fresh.join("files")), 0o700);
        drop(cache);
        // Its own directory, private, opens again.
        DiskCache::check(&fresh).unwrap();
        let _again = DiskCache::open(&fresh, 1 << 20).unwrap();
    }

    #[tokio::test]
    async fn the_temporary_cache_is_a_new_private_directory_with_an_unpredictable_name() {
        // The names a predictable scheme (`<prefix><pid>-<n>`) would pick, made first by an
        // "attacker", world-writable: the cache must use none of them.
        let tmp = std::env::temp_dir();
        struct Planted(Vec<std::path::PathBuf>);
        impl Drop for Planted {
            fn drop(&mut self) {
                for dir in &self.0 {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
        }
        let planted = Planted(
            (0..32)
                .map(|n| tmp.join(format!("modelmux-disk-cache-{}-{n}", std::process::id())))
                .collect(),
        );
        for dir in &planted.0 {
            let _ = std::fs::create_dir(dir);
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let first = DiskCache::temporary(1 << 20).unwrap();
        let second = DiskCache::temporary(1 << 20).unwrap();
        for cache in [&first, &second] {
            let dir = cache.dir().to_path_buf();
            assert!(!planted.0.contains(&dir), "{} was planted", dir.display());
            assert_eq!(mode(&dir), 0o700, "{}", dir.display());
            assert_eq!(
                std::fs::metadata(&dir).unwrap().uid(),
                nix::unistd::geteuid().as_raw()
            );
            let name = dir.file_name().unwrap().to_str().unwrap();
            let suffix = name.strip_prefix("modelmux-disk-cache-").unwrap();
            assert!(
                !suffix.starts_with(&format!("{}-", std::process::id())),
                "{name} is predictable"
            );
        }
        assert_ne!(first.dir(), second.dir());
        let dir = first.dir().to_path_buf();
        drop(first);
        assert!(!dir.exists(), "a temporary cache's directory goes with it");
    }
}
