//! TLS to etcd (rustls, on the `ring` provider: no C build, no system library): the CA that
//! signed the members' certificates, and the client's own certificate and key when etcd asks
//! for one (`--client-cert-auth`). Every file is read and checked when the options are made,
//! so a wrong path or a file that holds no certificate is an error then, not at the first call.

use std::fmt;
use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::Error;

/// How a [`Client`](crate::Client) verifies etcd's members and, if asked, proves who it is.
/// Set with [`ConnectOptions::with_tls`](crate::ConnectOptions::with_tls); endpoints are then
/// `https://` (a bare `host:port` is taken as one).
///
/// ```no_run
/// # fn example() -> Result<(), modelmux_etcd::Error> {
/// use modelmux_etcd::TlsOptions;
///
/// let tls = TlsOptions::from_ca_file("/etc/etcd/ca.pem")?
///     .with_identity_files("/etc/etcd/client.pem", "/etc/etcd/client-key.pem")?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct TlsOptions {
    ca_pem: Vec<u8>,
    /// The client's certificate chain and private key, PEM.
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
}

impl fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The private key never goes into debug output.
        f.debug_struct("TlsOptions")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_certificate", &self.identity.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

impl TlsOptions {
    /// Trusts the CA certificates in `ca_pem` (one or more PEM certificates) for etcd's
    /// members, and no other.
    pub fn from_ca_pem(ca_pem: impl Into<Vec<u8>>) -> Result<Self, Error> {
        Self::ca(ca_pem.into(), None)
    }

    /// [`from_ca_pem`](Self::from_ca_pem) with the PEM read from `path`.
    pub fn from_ca_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        Self::ca(read(path, "CA certificate")?, Some(path))
    }

    fn ca(ca_pem: Vec<u8>, path: Option<&Path>) -> Result<Self, Error> {
        certificates(&ca_pem, path, "CA certificate")?;
        Ok(Self {
            ca_pem,
            identity: None,
            domain: None,
        })
    }

    /// Presents `cert_pem` (the client's certificate, then any intermediates) and proves it
    /// holds `key_pem` (its private key: PKCS#8, PKCS#1 or SEC1) to etcd, which asks for both
    /// when started with `--client-cert-auth`.
    pub fn with_identity(
        self,
        cert_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Result<Self, Error> {
        self.identity(cert_pem.into(), None, key_pem.into(), None)
    }

    /// [`with_identity`](Self::with_identity) with the PEMs read from `cert_file` and
    /// `key_file`.
    pub fn with_identity_files(
        self,
        cert_file: impl AsRef<Path>,
        key_file: impl AsRef<Path>,
    ) -> Result<Self, Error> {
        let (cert_file, key_file) = (cert_file.as_ref(), key_file.as_ref());
        let cert = read(cert_file, "client certificate")?;
        let key = read(key_file, "client key")?;
        self.identity(cert, Some(cert_file), key, Some(key_file))
    }

    fn identity(
        mut self,
        cert: Vec<u8>,
        cert_file: Option<&Path>,
        key: Vec<u8>,
        key_file: Option<&Path>,
    ) -> Result<Self, Error> {
        certificates(&cert, cert_file, "client certificate")?;
        PrivateKeyDer::from_pem_slice(&key).map_err(|e| Error::InvalidTls {
            file: key_file.map(Path::to_path_buf),
            reason: format!("no private key in PEM form in it ({e})"),
        })?;
        self.identity = Some((cert, key));
        Ok(self)
    }

    /// Verifies every member's certificate for `name` rather than for the host its endpoint
    /// names (as when etcd is reached through an address its certificates do not list).
    pub fn with_domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    /// Whether a client certificate is presented.
    pub fn has_identity(&self) -> bool {
        self.identity.is_some()
    }

    /// tonic's configuration for one endpoint.
    pub(crate) fn client_config(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        config
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::InvalidTls {
        file: Some(path.to_path_buf()),
        reason: format!("cannot read the {what}: {e}"),
    })
}

/// Checks that `pem` holds at least one certificate, and nothing unreadable.
fn certificates(pem: &[u8], path: Option<&Path>, what: &str) -> Result<(), Error> {
    let invalid = |reason: String| Error::InvalidTls {
        file: path.map(PathBuf::from),
        reason,
    };
    let mut count = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        cert.map_err(|e| invalid(format!("the {what} is not valid PEM: {e}")))?;
        count += 1;
    }
    if count == 0 {
        return Err(invalid(format!("no {what} in PEM form in it")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_that_hold_no_certificate_or_key_are_refused_by_name() {
        let missing = TlsOptions::from_ca_file("/nonexistent/ca.pem").unwrap_err();
        assert!(
            matches!(&missing, Error::InvalidTls { file: Some(f), .. } if f == Path::new("/nonexistent/ca.pem")),
            "{missing:?}"
        );
        assert!(
            missing.to_string().contains("/nonexistent/ca.pem"),
            "{missing}"
        );
        let empty = TlsOptions::from_ca_pem(Vec::new()).unwrap_err();
        assert!(empty.to_string().contains("no CA certificate"), "{empty}");
        let garbage = TlsOptions::from_ca_pem(b"-----BEGIN CERTIFICATE-----\n!!\n".to_vec());
        assert!(garbage.is_err());
    }
}
