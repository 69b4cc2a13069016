//! The connection to an etcd cluster: one HTTP/2 channel balanced over its members' endpoints,
//! shared by every clone of a [`Client`]. It owns how calls reach etcd (timeouts, pings, the
//! leader requirement), never what they ask: the calls live in `kv.rs`, `watch.rs`, `lease.rs`
//! and `members.rs`.

use std::time::Duration;

use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};

use crate::Error;
use crate::generated::etcdserverpb::cluster_client::ClusterClient;
use crate::generated::etcdserverpb::kv_client::KvClient;
use crate::generated::etcdserverpb::lease_client::LeaseClient;
use crate::generated::etcdserverpb::maintenance_client::MaintenanceClient;
use crate::generated::etcdserverpb::watch_client::WatchClient;

/// How a [`Client`] reaches etcd. Every setting is off unless set.
#[derive(Debug, Clone, Default)]
pub struct ConnectOptions {
    connect_timeout: Option<Duration>,
    timeout: Option<Duration>,
    keep_alive: Option<(Duration, Duration)>,
    keep_alive_while_idle: bool,
    require_leader: bool,
}

impl ConnectOptions {
    /// No timeouts, no pings, answers from any member.
    pub fn new() -> Self {
        Self::default()
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
        if url.starts_with("https://") {
            return Err(invalid(
                "https is not supported: this client speaks plaintext HTTP/2 only".into(),
            ));
        }
        // A bare host:port means http, as etcd's own clients take it.
        let full = if url.starts_with("http://") {
            url.to_owned()
        } else {
            format!("http://{url}")
        };
        let mut endpoint = Endpoint::from_shared(full).map_err(|e| invalid(e.to_string()))?;
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

/// Adds the metadata every call carries.
#[derive(Debug, Clone)]
pub(crate) struct CallMetadata {
    require_leader: bool,
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
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) kv: KvClient<Transport>,
    pub(crate) watch: WatchClient<Transport>,
    pub(crate) lease: LeaseClient<Transport>,
    pub(crate) cluster: ClusterClient<Transport>,
    pub(crate) maintenance: MaintenanceClient<Transport>,
}

impl Client {
    /// A client of the cluster whose members answer at `endpoints` (`http://host:port`, or a
    /// bare `host:port`), each call going to one of them that is up.
    ///
    /// Nothing is dialled here: the members' connections open with the first call (and again
    /// after one breaks), each attempt bounded by
    /// [`with_connect_timeout`](ConnectOptions::with_connect_timeout). So this fails only when
    /// `endpoints` is empty or one is not a URL this client can use.
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
        let transport = InterceptedService::new(
            channel,
            CallMetadata {
                require_leader: options.require_leader,
            },
        );
        Ok(Self {
            kv: KvClient::new(transport.clone()),
            watch: WatchClient::new(transport.clone()),
            lease: LeaseClient::new(transport.clone()),
            cluster: ClusterClient::new(transport.clone()),
            maintenance: MaintenanceClient::new(transport),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_plaintext_http_urls() {
        let options = ConnectOptions::new();
        let uri = |url: &str| options.endpoint(url).map(|e| e.uri().to_string());
        assert_eq!(
            uri("http://10.0.0.1:2379").unwrap(),
            "http://10.0.0.1:2379/"
        );
        assert_eq!(uri("etcd-0:2379").unwrap(), "http://etcd-0:2379/");
        assert!(matches!(
            uri("https://etcd-0:2379"),
            Err(Error::InvalidEndpoint { .. })
        ));
        assert!(matches!(
            uri("http://no spaces"),
            Err(Error::InvalidEndpoint { .. })
        ));
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
        };
        let request = with.call(tonic::Request::new(())).unwrap();
        assert_eq!(request.metadata().get("hasleader").unwrap(), "true");
        let mut without = CallMetadata {
            require_leader: false,
        };
        let request = without.call(tonic::Request::new(())).unwrap();
        assert!(request.metadata().get("hasleader").is_none());
    }
}
