//! The admin token of a server started on loopback without one: made at start, written to a
//! file only the server's account can read, and read back from there by `modelmux status`,
//! `deploy` and `token`, as Jupyter and kubectl keep their credentials. Without it every
//! account of the machine could use the admin API (loopback is shared by all of them).
//!
//! The file is `<dir>/admin-<port>.token` (the token, one line, mode 0600), where `<dir>` is
//! `$MODELMUX_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/modelmux`, else
//! `$HOME/.local/state/modelmux`: a directory of this account's, mode 0700, made if missing.
//! One owned by another account, a link, or one other accounts may write is refused, as is a
//! token file other accounts may read. The server removes its file when it stops.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::config::HttpOptions;

/// The environment variable that names the token files' directory.
pub const RUNTIME_DIR_ENV: &str = "MODELMUX_RUNTIME_DIR";

/// Where the token files are (not checked: see [`private_dir`]).
pub fn runtime_dir() -> Result<PathBuf, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var(RUNTIME_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_RUNTIME_DIR") {
        return Ok(PathBuf::from(dir).join("modelmux"));
    }
    match var("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".local/state/modelmux")),
        None => Err(format!(
            "no directory for the admin token: set {RUNTIME_DIR_ENV}, XDG_RUNTIME_DIR or HOME"
        )),
    }
}

/// The token file of the server listening on `port`.
pub fn token_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("admin-{port}.token"))
}

/// [`runtime_dir`], made (mode 0700, its parents as usual) when `create` and missing, and
/// checked: a directory, not a link, owned by this account, that no other account can write.
/// A directory of this account's that others may only read or enter is made 0700.
pub fn private_dir(create: bool) -> Result<PathBuf, String> {
    let dir = runtime_dir()?;
    let shown = dir.display();
    if create && std::fs::symlink_metadata(&dir).is_err() {
        if let Some(parent) = dir.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("cannot make {shown}: {e}"))?;
        }
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot make {shown}: {e}")),
        }
    }
    let meta = std::fs::symlink_metadata(&dir).map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_dir() {
        return Err(format!("{shown} is not a directory (a link is refused)"));
    }
    if meta.uid() != euid() {
        return Err(format!(
            "{shown} belongs to another account (uid {}): refusing to keep or read an admin \
             token there",
            meta.uid()
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{shown} may be written by other accounts (mode {:o}): refusing to keep or read an \
             admin token there",
            meta.mode() & 0o777
        ));
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot make {shown} private: {e}"))?;
    }
    Ok(dir)
}

/// A fresh token: 32 random bytes, in hex.
pub fn generate() -> Result<String, String> {
    Ok(hex(&random::<32>()?))
}

/// `N` bytes from the kernel's random source.
pub(crate) fn random<const N: usize>() -> Result<[u8; N], String> {
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom: {e}"))?;
    Ok(bytes)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The token `modelmux serve` made for local users, and its file once the server listens.
#[derive(Debug)]
pub struct LocalToken {
    dir: PathBuf,
    token: String,
    file: Arc<Mutex<Option<TokenFile>>>,
}

impl LocalToken {
    /// For a server on loopback with no token configured (and not `trust_local_users`): a
    /// new token, set in `http` as a local one. Its directory is made and checked now, so
    /// that no server runs with a token nobody could read.
    pub fn plan(http: &mut HttpOptions, listen: SocketAddr) -> Result<Option<Self>, String> {
        if http.admin_token.is_some() || http.trust_local_users || !listen.ip().is_loopback() {
            return Ok(None);
        }
        let dir = private_dir(true)?;
        let token = generate()?;
        http.admin_token = Some(token.clone());
        http.admin_token_is_local = true;
        Ok(Some(Self {
            dir,
            token,
            file: Arc::default(),
        }))
    }

    /// What writes the file for the port the server got, as soon as it listens
    /// (`ServerBuilder::on_listening`).
    pub fn writer(&self) -> impl FnOnce(SocketAddr) + Send + 'static {
        let (dir, token, file) = (self.dir.clone(), self.token.clone(), self.file.clone());
        move |addr| match TokenFile::write(&dir, addr.port(), &token) {
            Ok(written) => *file.lock() = Some(written),
            Err(e) => tracing::error!(
                "{e}: nobody can use this server's admin API (set http_options.admin_token)"
            ),
        }
    }

    /// Its file, once written.
    pub fn path(&self) -> Option<PathBuf> {
        self.file.lock().as_ref().map(|f| f.path().to_owned())
    }
}

/// A token file the running server wrote; removed when dropped (if it still holds the token:
/// a later server on the same port may have replaced it).
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    token: String,
}

impl TokenFile {
    /// Writes `token` to `dir`'s file for `port` (mode 0600, replacing an older one whole: a
    /// reader never sees half a token).
    pub fn write(dir: &Path, port: u16, token: &str) -> Result<Self, String> {
        let path = token_path(dir, port);
        let temp = dir.join(format!(".admin-{port}.token.{}", std::process::id()));
        let _ = std::fs::remove_file(&temp);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&temp)
            .and_then(|mut f| f.write_all(format!("{token}\n").as_bytes()))
            .and_then(|()| std::fs::rename(&temp, &path));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(format!("cannot write {}: {e}", path.display()));
        }
        Ok(Self {
            path,
            token: token.to_owned(),
        })
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TokenFile {
    fn drop(&mut self) {
        if read_file(&self.path).is_ok_and(|t| t == self.token) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The token in `path`: a regular file of this account's that no other account can read
/// (anything else is refused, saying why).
pub fn read_file(path: &Path) -> Result<String, String> {
    let shown = path.display();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("{shown}: {e}"))?;
    if !meta.is_file() {
        return Err(format!("{shown} is not a file"));
    }
    if meta.uid() != euid() {
        return Err(format!("{shown} belongs to another account: not read"));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{shown} may be read by other accounts (mode {:o}): chmod 600 it",
            meta.mode() & 0o777
        ));
    }
    let mut text = String::new();
    file.take(4096)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read {shown}: {e}"))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!("{shown} is empty"));
    }
    Ok(token.to_owned())
}

/// The token of this account's server on `port`, from its file: None (and where it looked)
/// when there is no such file.
pub fn read_for_port(port: u16) -> Result<Result<(PathBuf, String), PathBuf>, String> {
    let dir = private_dir(false).or_else(|e| match runtime_dir() {
        // No directory yet: no server of this account's made a token.
        Ok(dir) if std::fs::symlink_metadata(&dir).is_err() => Ok(dir),
        _ => Err(e),
    })?;
    let path = token_path(&dir, port);
    if std::fs::symlink_metadata(&path).is_err() {
        return Ok(Err(path));
    }
    let token = read_file(&path)?;
    Ok(Ok((path, token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_token_reads_back_private_and_goes_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let file = TokenFile::write(dir.path(), 8123, "abc").unwrap();
        let meta = std::fs::metadata(file.path()).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(read_file(file.path()).unwrap(), "abc");
        let path = file.path().to_owned();
        drop(file);
        assert!(!path.exists());
    }

    #[test]
    fn a_token_file_others_may_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin-1.token");
        std::fs::write(&path, "abc\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read_file(&path).unwrap_err();
        assert!(err.contains("may be read by other accounts"), "{err}");
    }

    #[test]
    fn tokens_are_64_hex_digits_and_differ() {
        let (a, b) = (generate().unwrap(), generate().unwrap());
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
