//! The HTTP client of remote repositories (S3 and plain web servers): `object_store`'s reqwest
//! client, built from the same [`ClientOptions`], except that it follows no redirect that
//! leaves the origin (scheme, host and port) of the request.
//!
//! reqwest follows up to ten redirects anywhere by default, and `object_store` sets no policy
//! (nor lets one be set), so an open redirect on an allowed adapter host or on an `http://`
//! repository could send the server's request to any address it can reach (blind SSRF: the
//! cloud metadata service at 169.254.169.254, an admin port on loopback). A redirect off the
//! origin is refused before anything is sent to its target, and fails the fetch at once (not
//! retried) with an error that names both URLs ([`RedirectRefused`]).
//!
//! `object_store` builds its client in a private function, so [`Connector`] builds its own from
//! the options' values ([`ClientOptions::get_config_value`]), as `object_store` 0.14 does:
//! user agent, proxy (with its CA and exclusions), system certificates, timeouts, pool and
//! HTTP/2 settings, HTTP/1 or HTTP/2 only, invalid certificates, no compression, shuffled DNS
//! answers (or the options' own resolver) and `allow_http`. Check it against
//! `ClientOptions::client` when `object_store` is upgraded.

/// A redirect the client would not follow: to another origin, or one too many.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server answered {from} with a redirect to {to}, which was not followed: {why} \
     (a redirect could send the request to any address this server can reach; point the \
     repository at the final location instead)"
)]
pub(crate) struct RedirectRefused {
    /// The URL that answered with the redirect (without its query).
    pub(crate) from: String,
    /// Where it pointed (without its query).
    pub(crate) to: String,
    /// Why it was refused.
    pub(crate) why: &'static str,
}

/// The [`RedirectRefused`] somewhere in `error`'s chain of sources, if any.
pub(crate) fn refused_redirect<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a RedirectRefused> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(refused) = error.downcast_ref::<RedirectRefused>() {
            return Some(refused);
        }
        next = error.source();
    }
    None
}

/// What to tell the user of a failed store call: the refused redirect when that is what
/// happened (`object_store`'s message says only "error following redirect"), else the error.
pub(crate) fn message(error: &object_store::Error) -> String {
    match refused_redirect(error) {
        Some(refused) => refused.to_string(),
        None => error.to_string(),
    }
}

#[cfg(any(feature = "s3", feature = "http"))]
pub(crate) use connector::Connector;

/// The client itself (only in builds with remote repositories).
#[cfg(any(feature = "s3", feature = "http"))]
mod connector {
    use super::RedirectRefused;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Duration;

    use object_store::client::{DnsResolver, HttpClient, HttpConnector};
    use object_store::{ClientConfigKey as Key, ClientOptions};

    /// Redirects followed within one origin, at most (reqwest's own limit).
    const MAX_REDIRECTS: usize = 10;

    /// Makes `object_store`'s HTTP clients: reqwest with the redirect policy above.
    #[derive(Debug, Default, Clone, Copy)]
    pub(crate) struct Connector;

    impl HttpConnector for Connector {
        fn connect(&self, options: &ClientOptions) -> object_store::Result<HttpClient> {
            Ok(HttpClient::new(client(options)?))
        }
    }

    /// `url` as an error shows it: no query (it may hold a signature), no user or password.
    fn shown(url: &url::Url) -> String {
        let mut url = url.clone();
        url.set_query(None);
        url.set_fragment(None);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.to_string()
    }

    fn redirect_policy() -> reqwest::redirect::Policy {
        reqwest::redirect::Policy::custom(|attempt| {
            let previous = attempt.previous();
            let (Some(first), Some(last)) = (previous.first(), previous.last()) else {
                return attempt.stop();
            };
            let why = if attempt.url().origin() != first.origin() {
                Some("it leaves the repository's origin (scheme, host and port)")
            } else if previous.len() > MAX_REDIRECTS {
                Some("too many redirects")
            } else {
                None
            };
            match why {
                None => attempt.follow(),
                Some(why) => {
                    let refused = RedirectRefused {
                        from: shown(last),
                        to: shown(attempt.url()),
                        why,
                    };
                    tracing::warn!(from = %refused.from, to = %refused.to, "{why}: redirect refused");
                    attempt.error(refused)
                }
            }
        })
    }

    fn generic(source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> object_store::Error {
        object_store::Error::Generic {
            store: "HTTP client",
            source: source.into(),
        }
    }

    /// reqwest's client as `object_store` builds it from `options`, with [`redirect_policy`].
    fn client(options: &ClientOptions) -> object_store::Result<reqwest::Client> {
        let value = |key: Key| options.get_config_value(&key);
        let flag = |key: Key| -> object_store::Result<bool> {
            match value(key).map(|v| v.to_ascii_lowercase()).as_deref() {
                None | Some("0" | "false" | "off" | "no" | "n") => Ok(false),
                Some("1" | "true" | "on" | "yes" | "y") => Ok(true),
                Some(other) => Err(generic(format!(
                    "{}: '{other}' is not a boolean",
                    key.as_ref()
                ))),
            }
        };
        let duration = |key: Key| -> object_store::Result<Option<Duration>> {
            value(key)
                .map(|v| {
                    humantime::parse_duration(&v)
                        .map_err(|e| generic(format!("{}: {e}", key.as_ref())))
                })
                .transpose()
        };
        let number = |key: Key| -> object_store::Result<Option<u64>> {
            value(key)
                .map(|v| {
                    v.parse()
                        .map_err(|e| generic(format!("{}: {e}", key.as_ref())))
                })
                .transpose()
        };

        let mut builder = reqwest::ClientBuilder::new()
            .user_agent(value(Key::UserAgent).unwrap_or_else(|| {
                concat!("modelmux-store/", env!("CARGO_PKG_VERSION")).to_string()
            }))
            .redirect(redirect_policy());
        if let Some(headers) = options.get_default_headers() {
            builder = builder.default_headers(headers.clone());
        }
        if let Some(url) = value(Key::ProxyUrl) {
            let mut proxy = reqwest::Proxy::all(url).map_err(generic)?;
            if let Some(pem) = value(Key::ProxyCaCertificate) {
                let certificate =
                    reqwest::tls::Certificate::from_pem(pem.as_bytes()).map_err(generic)?;
                builder = builder.tls_certs_merge(std::iter::once(certificate));
            }
            if let Some(excludes) = value(Key::ProxyExcludes) {
                proxy = proxy.no_proxy(reqwest::NoProxy::from_string(&excludes));
            }
            builder = builder.proxy(proxy);
        }
        if flag(Key::NoSystemCertificates)? {
            builder = builder.tls_certs_only(std::iter::empty());
        }
        if let Some(timeout) = duration(Key::Timeout)? {
            builder = builder.timeout(timeout);
        }
        if let Some(timeout) = duration(Key::ConnectTimeout)? {
            builder = builder.connect_timeout(timeout);
        }
        if let Some(timeout) = duration(Key::ReadTimeout)? {
            builder = builder.read_timeout(timeout);
        }
        if let Some(timeout) = duration(Key::PoolIdleTimeout)? {
            builder = builder.pool_idle_timeout(timeout);
        }
        if let Some(max) = number(Key::PoolMaxIdlePerHost)? {
            builder = builder.pool_max_idle_per_host(usize::try_from(max).unwrap_or(usize::MAX));
        }
        if let Some(interval) = duration(Key::Http2KeepAliveInterval)? {
            builder = builder.http2_keep_alive_interval(interval);
        }
        if let Some(timeout) = duration(Key::Http2KeepAliveTimeout)? {
            builder = builder.http2_keep_alive_timeout(timeout);
        }
        if flag(Key::Http2KeepAliveWhileIdle)? {
            builder = builder.http2_keep_alive_while_idle(true);
        }
        if let Some(size) = number(Key::Http2MaxFrameSize)? {
            let size = u32::try_from(size).map_err(generic)?;
            builder = builder.http2_max_frame_size(Some(size));
        }
        if flag(Key::Http1Only)? {
            builder = builder.http1_only();
        }
        if flag(Key::Http2Only)? {
            builder = builder.http2_prior_knowledge();
        }
        if flag(Key::AllowInvalidCertificates)? {
            builder = builder.danger_accept_invalid_certs(true);
        }
        // Compression would change the lengths that sizes are checked against.
        builder = builder.no_gzip().no_brotli().no_zstd().no_deflate();
        let custom = options.dns_resolver().cloned();
        if custom.is_some() || flag(Key::RandomizeAddresses)? {
            builder = builder.dns_resolver(Arc::new(Resolver(custom)));
        }
        builder
            .https_only(!flag(Key::AllowHttp)?)
            .build()
            .map_err(generic)
    }

    /// Name resolution as `object_store` does it: the options' resolver when they have one, else
    /// the system's answers in a random order (so replicas spread over a store's addresses).
    struct Resolver(Option<Arc<dyn DnsResolver>>);

    impl reqwest::dns::Resolve for Resolver {
        fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
            let custom = self.0.clone();
            let host = name.as_str().to_string();
            Box::pin(async move {
                // The port is the URL's: reqwest sets it on every address.
                // A resolver of the options' orders its own answers.
                let addrs: Vec<SocketAddr> = match custom {
                    Some(resolver) => resolver
                        .resolve(&host)
                        .await?
                        .into_iter()
                        .map(|ip| SocketAddr::new(ip, 0))
                        .collect(),
                    None => {
                        let mut addrs: Vec<SocketAddr> =
                            tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
                        for i in (1..addrs.len()).rev() {
                            let j = (crate::retry::random() % (i as u64 + 1)) as usize;
                            addrs.swap(i, j);
                        }
                        addrs
                    }
                };
                let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
                Ok(addrs)
            })
        }
    }
}

#[cfg(all(test, any(feature = "s3", feature = "http")))]
mod tests {
    use object_store::ClientConfigKey as Key;
    use object_store::ClientOptions;
    use object_store::client::HttpConnector;

    #[test]
    fn every_option_a_repository_may_set_builds_a_client_and_bad_values_are_errors() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut options = ClientOptions::new()
            .with_timeout(std::time::Duration::from_secs(30))
            .with_connect_timeout(std::time::Duration::from_secs(5));
        for (key, value) in [
            (Key::AllowHttp, "true"),
            (Key::AllowInvalidCertificates, "yes"),
            (Key::ProxyUrl, "http://127.0.0.1:3128"),
            (Key::ProxyExcludes, "localhost,.internal"),
            (Key::UserAgent, "test-agent"),
            (Key::ReadTimeout, "10s"),
            (Key::PoolIdleTimeout, "1m"),
            (Key::PoolMaxIdlePerHost, "4"),
            (Key::Http2KeepAliveInterval, "20s"),
            (Key::Http2KeepAliveTimeout, "5s"),
            (Key::Http2KeepAliveWhileIdle, "on"),
            (Key::Http2MaxFrameSize, "65536"),
            (Key::Http1Only, "true"),
            (Key::RandomizeAddresses, "false"),
        ] {
            options = options.with_config(key, value);
        }
        super::Connector.connect(&options).unwrap();
        let bad = ClientOptions::new().with_config(Key::PoolMaxIdlePerHost, "many");
        let err = super::Connector.connect(&bad).unwrap_err().to_string();
        assert!(err.contains("pool_max_idle_per_host"), "{err}");
    }
}
