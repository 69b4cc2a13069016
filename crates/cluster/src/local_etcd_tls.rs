//! A [`LocalEtcd`] as a cluster's etcd should be run: clients only over TLS, each with a
//! certificate the cluster's CA signed (`--client-cert-auth`), and authentication enabled
//! (`auth enable`), with a `modelmux` user that may read and write `modelmux/` only. The CA,
//! the members' certificate and a client certificate are made here (rcgen), in the etcd's
//! temporary directory. (Behind the `local-etcd-tls` feature: only tests need it.)

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use modelmux_etcd::{Client, ConnectOptions, Credentials, TlsOptions};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::LocalEtcd;
use crate::local_etcd::Launch;

/// The user a secure [`LocalEtcd`] has for modelmux.
pub const USER: &str = "modelmux";
/// The keys that user may read and write.
pub const USER_PREFIX: &str = "modelmux/";
/// The common name of the client certificate: no user's name, so the certificate alone
/// authenticates no one (etcd takes a client certificate's CN as the user when a call carries
/// no token).
pub const CLIENT_CN: &str = "modelmux-test-client";

/// What a client needs to reach a secure [`LocalEtcd`]: the files and the users.
#[derive(Debug, Clone)]
pub struct SecureEtcd {
    /// The CA that signed the members' and the client's certificates (PEM).
    pub ca_file: PathBuf,
    /// A client certificate the CA signed (PEM, CN [`CLIENT_CN`]).
    pub cert_file: PathBuf,
    /// Its private key (PEM, PKCS#8).
    pub key_file: PathBuf,
    /// [`USER`]'s password, and a file that holds it (no newline; mode 0600).
    pub password: String,
    /// The file holding [`password`](Self::password).
    pub password_file: PathBuf,
    /// `root`'s password.
    pub root_password: String,
}

impl SecureEtcd {
    /// TLS with the CA and the client certificate.
    pub fn tls(&self) -> TlsOptions {
        TlsOptions::from_ca_file(&self.ca_file)
            .and_then(|tls| tls.with_identity_files(&self.cert_file, &self.key_file))
            .expect("the files this etcd made")
    }

    /// [`USER`] with its password.
    pub fn credentials(&self) -> Credentials {
        Credentials::new(USER, self.password.clone())
    }

    /// TLS with the client certificate, as [`USER`].
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_tls(self.tls())
            .with_credentials(self.credentials())
    }
}

/// How a secure [`LocalEtcd`] is started.
#[derive(Debug, Clone, Default)]
pub struct SecureOptions {
    /// How long a token lives unused (`--auth-token-ttl`; etcd's default is 300 s).
    pub token_ttl: Option<Duration>,
}

impl LocalEtcd {
    /// Starts `members` members on loopback that take clients only over TLS with a client
    /// certificate, enables authentication (users `root` and [`USER`], the latter with read
    /// and write on [`USER_PREFIX`]), and waits until the cluster has a leader.
    pub async fn start_secure(members: usize) -> std::io::Result<Self> {
        Self::start_secure_with(members, SecureOptions::default()).await
    }

    /// [`start_secure`](Self::start_secure), as `options` say.
    pub async fn start_secure_with(
        members: usize,
        options: SecureOptions,
    ) -> std::io::Result<Self> {
        let host = IpAddr::from([127, 0, 0, 1]);
        let dir = tempfile::tempdir()?;
        let files = make_pki(dir.path(), host).map_err(std::io::Error::other)?;
        let password = "modelmux-test-password".to_owned();
        let password_file = dir.path().join("etcd-password");
        write_private(&password_file, password.as_bytes())?;
        let secure = SecureEtcd {
            ca_file: files.ca,
            cert_file: files.client_cert,
            key_file: files.client_key,
            password,
            password_file,
            root_password: "root-test-password".into(),
        };
        // Before auth is on, the client certificate alone will do.
        let admin = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_tls(secure.tls());
        let mut launch = Launch {
            tls: Some((files.server_cert, files.server_key, secure.ca_file.clone())),
            args: Vec::new(),
            admin: Some(admin),
        };
        if let Some(ttl) = options.token_ttl {
            let secs = ttl.as_secs().max(1).to_string();
            launch.args.extend(["--auth-token-ttl".to_owned(), secs]);
        }
        let mut etcd = Self::launch(members, host, dir, launch).await?;
        enable_auth(&etcd, &secure)
            .await
            .map_err(|e| std::io::Error::other(format!("enabling etcd's auth: {e}")))?;
        etcd.admin = etcd
            .admin
            .clone()
            .with_credentials(Credentials::new("root", secure.root_password.clone()));
        etcd.secure = Some(secure);
        Ok(etcd)
    }

    /// The files and users of a secure etcd ([`start_secure`](Self::start_secure)); `None`
    /// for a plaintext one.
    pub fn secure(&self) -> Option<&SecureEtcd> {
        self.secure.as_ref()
    }
}

/// Users `root` (role `root`) and [`USER`] (role `modelmux`: read and write on
/// [`USER_PREFIX`]), then `auth enable`: what `etcdctl user add`, `role add`, `role grant-permission
/// --prefix`, `user grant-role` and `auth enable` do.
async fn enable_auth(etcd: &LocalEtcd, secure: &SecureEtcd) -> Result<(), modelmux_etcd::Error> {
    let client = Client::connect(etcd.endpoints(), etcd.admin.clone()).await?;
    client.role_add("root").await?;
    client.user_add("root", &secure.root_password).await?;
    client.user_grant_role("root", "root").await?;
    client.role_add(USER).await?;
    client.role_grant_prefix(USER, USER_PREFIX).await?;
    client.user_add(USER, &secure.password).await?;
    client.user_grant_role(USER, USER).await?;
    client.auth_enable().await?;
    Ok(())
}

/// The PEM files [`make_pki`] writes.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// A CA, a certificate for the members (`localhost` and `host`) and a client certificate (CN
/// [`CLIENT_CN`]), written under `dir`.
fn make_pki(dir: &Path, host: IpAddr) -> Result<Pki, Box<dyn std::error::Error + Send + Sync>> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "modelmux test CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);

    let leaf = |names: Vec<String>, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names)?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &issuer)?;
        Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
    };
    // The members' certificate serves clients, and etcd's gateway dials the member with it.
    let (server_cert, server_key) = leaf(
        vec!["localhost".into(), host.to_string()],
        "etcd",
        vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    )?;
    let (client_cert, client_key) = leaf(
        Vec::new(),
        CLIENT_CN,
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    )?;
    let pki = Pki {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
    };
    std::fs::write(&pki.ca, ca_cert.pem())?;
    std::fs::write(&pki.server_cert, server_cert)?;
    write_private(&pki.server_key, server_key.as_bytes())?;
    std::fs::write(&pki.client_cert, client_cert)?;
    write_private(&pki.client_key, client_key.as_bytes())?;
    Ok(pki)
}

/// Writes `bytes` to a new file at `path` that only this user may read.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)
}
