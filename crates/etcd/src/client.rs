//! The connection to an etcd cluster: one HTTP/2 channel balanced over its members' endpoints,
//! shared by every clone of a [`Client`]. It owns how calls reach etcd (timeouts, pings, the
//! leader requirement, TLS, the auth token), never what they ask: the calls live in `kv.rs`,
//! `watch.rs`, `lease.rs`, `members.rs` and `auth.rs`.

use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};

use crate::auth::{Auth, TokenSlot};
use crate::generated::etcdserverpb::auth_client::AuthClient;
use crate::generated::etcdserverpb::cluster_client::ClusterClient;
use crate::generated::etcdserverpb::kv_client::KvClient;
use crate::generated::etcdserverpb::lease_client::LeaseClient;
use crate::generated::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::generated::etcdserverpb::watch_client::WatchClient;
use crate::{Credentials, Error, TlsOptions};

/// How a [`Client`] reaches etcd. Every setting is off unless set.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
    keep_alive_while_idle: bool,
    require_leader: bool,
    tls: Option<TlsOptions>,
    credentials: Option<Credentials>,
}

impl ConnectOptions {
    /// No timeouts, no pings, answers from any member, plaintext, no user.
    pub fn new() -> Self {
        Self::default()
    }

    /// Speaks TLS to every member (`https://` endpoints; a bare `host:port` is taken as one),
    /// verifying its certificate with `tls`'s CA and presenting `tls`'s client certificate, if
    /// it has one. Without it the client speaks plaintext HTTP/2 and refuses `https://`.
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates as `credentials`' user (etcd started with auth enabled): every call
    /// carries the token etcd issues for it, and a new one is asked for when etcd says the
    /// token expired. Use it with [`with_tls`](Self::with_tls): the password and the token
    /// would otherwise cross the network in clear.
    pub fn with_credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// How long opening a connection to a member may take.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// How long a call may wait for etcd's answer (for a watch or a keep-alive: for the stream
    /// to open). A call past it fails with code `Cancelled`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Sends an HTTP/2 ping every `interval` and drops the connection when one goes unanswered
    /// for `timeout`: how a member that died without closing its connections is noticed.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive = Some((interval, timeout));
        self
    }

    /// Whether the pings of [`with_keep_alive`](Self::with_keep_alive) go on while no call is
    /// in flight.
    pub fn with_keep_alive_while_idle(mut self, enabled: bool) -> Self {
        self.keep_alive_while_idle = enabled;
        self
    }

    /// Whether calls are answered only by a member that has a leader (etcd's `hasleader`
    /// metadata): a member cut off from the others then fails calls with "no leader" (and ends
    /// its watches) instead of serving what it last knew.
    pub fn with_require_leader(mut self, enabled: bool) -> Self {
        self.require_leader = enabled;
        self
    }

    fn endpoint(&self, url: &str) -> Result<Endpoint, Error> {
        let invalid = |reason: String| Error::InvalidEndpoint {
            endpoint: url.to_owned(),
            reason,
        };
        let tls = self.tls.is_some();
        // A bare host:port means https with TLS options, else http, as etcd's own clients
        // take it.
        let full = if url.starts_with("https://") {
            if !tls {
                return Err(invalid(
                    "https needs TLS options (the CA that signed etcd's certificates)".into(),
                ));
            }
            url.to_owned()
        } else if url.starts_with("http://") {
            if tls {
                return Err(invalid(
                    "TLS options are set, so the endpoint must be https:// (or a bare host:port)"
                        .into(),
                ));
            }
            url.to_owned()
        } else if tls {
            format!("https://{url}")
        } else {
            format!("http://{url}")
        };
        let mut endpoint = Endpoint::from_shared(full).map_err(|e| invalid(e.to_string()))?;
        if let Some(tls) = &self.tls {
            let mut config = tls.client_config();
            if let Some(timeout) = self.connect_timeout {
                config = config.timeout(timeout);
            }
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| invalid(crate::error::describe_error(&e)))?;
        }
        if let Some((interval, timeout)) = self.keep_alive {
            endpoint = endpoint
                .keep_alive_while_idle(self.keep_alive_while_idle)
                .http2_keep_alive_interval(interval)
                .keep_alive_timeout(timeout);
        }
        if let Some(timeout) = self.timeout {
            endpoint = endpoint.timeout(timeout);
        }
        if let Some(timeout) = self.connect_timeout {
            endpoint = endpoint.connect_timeout(timeout);
        }
        Ok(endpoint)
    }
}

/// The channel every generated client is built on.
pub(crate) type Transport = InterceptedService<Channel, CallMetadata>;

/// Adds the metadata every call carries: the leader requirement, and the auth token.
#[derive(Clone)]
pub(crate) struct CallMetadata {
    require_leader: bool,
    token: Option<Arc<TokenSlot>>,
}

impl Interceptor for CallMetadata {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if self.require_leader {
            request
                .metadata_mut()
                .insert("hasleader", AsciiMetadataValue::from_static("true"));
        }
        if let Some(slot) = &self.token {
            let slot = slot.read();
            if let Some(token) = slot.as_ref() {
                request.metadata_mut().insert("token", token.value.clone());
            }
        }
        Ok(request)
    }
}

/// A client of one etcd cluster. Cloning it is cheap, and clones share one connection per
/// member.
///
/// ```no_run
/// # async fn example() -> Result<(), modelmux_etcd::Error> {
/// use std::time::Duration;
/// use modelmux_etcd::{Client, ConnectOptions};
///
/// let options = ConnectOptions::new()
///     .with_connect_timeout(Duration::from_secs(2))
///     .with_timeout(Duration::from_secs(2));
/// let client = Client::connect(["http://127.0.0.1:2379"], options).await?;
/// client.put("greeting", "hello", None).await?;
/// let reply = client.get("greeting").await?;
/// assert_eq!(reply.kvs[0].value, b"hello");
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) kv: KvClient<Transport>,
    pub(crate) watch: WatchClient<Transport>,
    pub(crate) lease: LeaseClient<Transport>,
    pub(crate) cluster: ClusterClient<Transport>,
    pub(crate) maintenance: MaintenanceClient<Transport>,
    /// Auth calls that carry the token (setting up users and roles).
    pub(crate) auth_admin: AuthClient<Transport>,
    /// The credentials and token, when the client authenticates.
    pub(crate) auth: Option<Arc<Auth>>,
    /// It speaks TLS without a client certificate: a connection etcd closes may mean that etcd
    /// wants one.
    tls_without_identity: bool,
}

impl Client {
    /// `error`, with what it may mean for this client's settings when the error alone does not
    /// say: etcd that wants a client certificate often just closes the connection of a client
    /// that has none (its TLS alert is lost when the connection is reset).
    pub(crate) fn explain(&self, error: Error) -> Error {
        match error {
            Error::Status(status)
                if self.tls_without_identity
                    && matches!(
                        status.code(),
                        tonic::Code::Cancelled | tonic::Code::Unavailable | tonic::Code::Unknown
                    ) =>
            {
                let text = crate::error::describe(&status);
                if !["connection closed", "connection reset", "broken pipe"]
                    .iter()
                    .any(|m| text.to_lowercase().contains(m))
                {
                    return Error::Status(status);
                }
                Error::Status(tonic::Status::new(
                    status.code(),
                    format!(
                        "{text} (etcd closed the TLS connection: this client presents no client \
                         certificate, and etcd started with --client-cert-auth asks for one; \
                         give the client certificate and key)"
                    ),
                ))
            }
            other => other,
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("authenticates", &self.auth.is_some())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the cluster whose members answer at `endpoints` (`http://host:port`,
    /// `https://host:port` with [TLS](ConnectOptions::with_tls), or a bare `host:port`), each
    /// call going to one of them that is up.
    ///
    /// Nothing is dialled here: the members' connections open with the first call (and again
    /// after one breaks), each attempt bounded by
    /// [`with_connect_timeout`](ConnectOptions::with_connect_timeout); with
    /// [credentials](ConnectOptions::with_credentials), the first call asks for the token. So
    /// this fails only when `endpoints` is empty or one is not a URL this client can use.
    pub async fn connect<E: AsRef<str>>(
        endpoints: impl IntoIterator<Item = E>,
        options: ConnectOptions,
    ) -> Result<Self, Error> {
        let endpoints = endpoints
            .into_iter()
            .map(|e| options.endpoint(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        // Balanced even over one endpoint, so a member's connection that breaks is opened
        // again by the channel, never by the caller. The channel reads its queue of endpoint
        // changes only once a call comes, so the queue must hold them all.
        let (channel, changes) = Channel::balance_channel(endpoints.len());
        for endpoint in endpoints {
            let key = endpoint.uri().clone();
            // Cannot fail: the queue has room, and its reader lives in `channel`, held here.
            let _ = changes.try_send(Change::Insert(key, endpoint));
        }
        let slot = options
            .credentials
            .as_ref()
            .map(|_| Arc::new(TokenSlot::default()));
        let untokened = InterceptedService::new(
            channel.clone(),
            CallMetadata {
                require_leader: options.require_leader,
                token: None,
            },
        );
        let transport = InterceptedService::new(
            channel,
            CallMetadata {
                require_leader: options.require_leader,
                token: slot.clone(),
            },
        );
        let auth = options.credentials.zip(slot).map(|(credentials, slot)| {
            Arc::new(Auth::new(credentials, slot, AuthClient::new(untokened)))
        });
        Ok(Self {
            kv: KvClient::new(transport.clone()),
            watch: WatchClient::new(transport.clone()),
            lease: LeaseClient::new(transport.clone()),
            cluster: ClusterClient::new(transport.clone()),
            maintenance: MaintenanceClient::new(transport.clone()),
            auth_admin: AuthClient::new(transport),
            auth,
            tls_without_identity: options.tls.as_ref().is_some_and(|t| !t.has_identity()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_tls_endpoints_are_plaintext_http_urls() {
        let options = ConnectOptions::new();
        let uri = |url: &str| options.endpoint(url).map(|e| e.uri().to_string());
        assert_eq!(
            uri("http://10.0.0.1:2379").unwrap(),
            "http://10.0.0.1:2379/"
        );
        assert_eq!(uri("etcd-0:2379").unwrap(), "http://etcd-0:2379/");
        let https = uri("https://etcd-0:2379").unwrap_err();
        assert!(
            matches!(&https, Error::InvalidEndpoint { reason, .. } if reason.contains("TLS options")),
            "{https:?}"
        );
        assert!(matches!(
            uri("http://no spaces"),
            Err(Error::InvalidEndpoint { .. })
        ));
    }

    /// A CA certificate, PEM, and a client certificate and key it signed.
    fn pki() -> (String, String, String) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let client_key = KeyPair::generate().unwrap();
        let client = CertificateParams::new(vec!["client".into()])
            .unwrap()
            .signed_by(&client_key, &issuer)
            .unwrap();
        (ca_cert.pem(), client.pem(), client_key.serialize_pem())
    }

    #[test]
    fn with_tls_endpoints_are_https_urls() {
        let (ca, cert, key) = pki();
        let tls = TlsOptions::from_ca_pem(ca.clone())
            .unwrap()
            .with_identity(cert.clone(), key)
            .unwrap();
        assert!(tls.has_identity());
        let options = ConnectOptions::new().with_tls(tls);
        let uri = |url: &str| options.endpoint(url).map(|e| e.uri().to_string());
        assert_eq!(uri("https://etcd-0:2379").unwrap(), "https://etcd-0:2379/");
        assert_eq!(uri("etcd-0:2379").unwrap(), "https://etcd-0:2379/");
        let plain = uri("http://etcd-0:2379").unwrap_err();
        assert!(
            matches!(&plain, Error::InvalidEndpoint { reason, .. } if reason.contains("https")),
            "{plain:?}"
        );
        // A key that is not one, or a certificate given as the key, is refused when given.
        let ca_only = TlsOptions::from_ca_pem(ca).unwrap();
        assert!(!ca_only.has_identity());
        let wrong = ca_only.with_identity(cert.clone(), cert).unwrap_err();
        assert!(wrong.to_string().contains("no private key"), "{wrong}");
    }

    #[test]
    fn the_token_travels_as_sensitive_metadata() {
        let slot = Arc::new(TokenSlot::default());
        let mut metadata = CallMetadata {
            require_leader: false,
            token: Some(slot.clone()),
        };
        // None issued yet: none sent.
        let request = metadata.call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get("token").is_none());
        let mut value = AsciiMetadataValue::from_static("tok.1");
        value.set_sensitive(true);
        *slot.write() = Some(crate::auth::Token {
            generation: 1,
            value,
        });
        let request = metadata.call(tonic::Request::new(())).unwrap();
        let token = request.metadata().get("token").unwrap();
        assert_eq!(token, "tok.1");
        assert!(token.is_sensitive());
    }

    #[tokio::test]
    async fn connect_needs_an_endpoint_and_dials_nothing() {
        let none: [&str; 0] = [];
        assert!(matches!(
            Client::connect(none, ConnectOptions::new()).await,
            Err(Error::NoEndpoints)
        ));
        // Port 9 on loopback: nothing listens there, and connect does not dial.
        assert!(
            Client::connect(["http://127.0.0.1:9"], ConnectOptions::new())
                .await
                .is_ok()
        );
    }

    #[test]
    fn the_leader_requirement_travels_as_metadata() {
        let mut with = CallMetadata {
            require_leader: true,
            token: None,
        };
        let request = with.call(tonic::Request::new(())).unwrap();
        assert_eq!(request.metadata().get("hasleader").unwrap(), "true");
        let mut without = CallMetadata {
            require_leader: false,
            token: None,
        };
        let request = without.call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get("hasleader").is_none());
    }
}
