//! One process's lease and the records it keeps on it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use modelmux_etcd::Client;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ClusterError;
use crate::supervise::spawn_restarting;

/// How soon a failed call is tried again while putting the records back on a new lease.
const RETRY: Duration = Duration::from_millis(200);

/// How long [`Registry::close`] keeps trying to revoke the lease.
const CLOSE_TRIES_FOR: Duration = Duration::from_secs(5);

/// How a [`Registry`] keeps its lease.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RegistryOptions {
    /// The lease's time to live: how long after this process stops keeping it alive (it died,
    /// or lost etcd) its records disappear. Kept alive every third of it.
    pub ttl: Duration,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        Self {
            ttl: Duration::from_secs(3),
        }
    }
}

impl RegistryOptions {
    /// Options with this lease TTL (whole seconds, at least 1).
    pub fn with_ttl(ttl: Duration) -> Self {
        Self { ttl }
    }

    fn ttl_secs(&self) -> i64 {
        i64::try_from(self.ttl.as_secs().max(1)).unwrap_or(i64::MAX)
    }
}

/// One process's records in etcd, all on one lease that it keeps alive. If etcd lets the lease
/// expire (the process was cut off longer than the TTL), a new lease is granted and every
/// record is written again on it.
pub struct Registry {
    shared: Arc<Shared>,
    keeper: JoinHandle<()>,
}

struct Shared {
    client: Client,
    options: RegistryOptions,
    lease: AtomicI64,
    /// What this process has published: written again on a new lease.
    records: Mutex<BTreeMap<String, Vec<u8>>>,
    /// When etcd last answered (ms after `started`).
    last_contact: AtomicU64,
    started: Instant,
}

impl Shared {
    fn contact(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_contact.store(ms, Ordering::Relaxed);
    }
}

impl Registry {
    /// Grants this process's lease and starts keeping it alive.
    pub async fn start(client: Client, options: RegistryOptions) -> Result<Self, ClusterError> {
        let lease = client.lease_grant(options.ttl_secs()).await?.id;
        let shared = Arc::new(Shared {
            client,
            options,
            lease: AtomicI64::new(lease),
            records: Mutex::default(),
            last_contact: AtomicU64::new(0),
            started: Instant::now(),
        });
        let kept = shared.clone();
        let keeper = spawn_restarting("lease keeper", move || keep_alive(kept.clone()));
        Ok(Self { shared, keeper })
    }

    /// The lease the records are on now.
    pub fn lease_id(&self) -> i64 {
        self.shared.lease.load(Ordering::SeqCst)
    }

    /// How long since etcd last answered this process (a keep-alive or a write).
    pub fn since_contact(&self) -> Duration {
        let last = Duration::from_millis(self.shared.last_contact.load(Ordering::Relaxed));
        self.shared.started.elapsed().saturating_sub(last)
    }

    /// Publishes `key` (on the lease): it lives as long as this process keeps its lease.
    pub async fn put(&self, key: &str, value: impl Into<Vec<u8>>) -> Result<(), ClusterError> {
        let value = value.into();
        let mut records = self.shared.records.lock().await;
        records.insert(key.to_owned(), value.clone());
        let lease = self.lease_id();
        self.shared.client.put(key, value, Some(lease)).await?;
        self.shared.contact();
        Ok(())
    }

    /// Removes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), ClusterError> {
        let mut records = self.shared.records.lock().await;
        records.remove(key);
        self.shared.client.delete(key).await?;
        self.shared.contact();
        Ok(())
    }

    /// Revokes the lease, so every record disappears at once (a clean stop), and stops keeping
    /// it alive.
    ///
    /// A failed revoke (etcd electing a leader, a member gone) is tried again for up to
    /// 5 s; if it still fails, the records go when the lease expires.
    pub async fn close(&self) -> Result<(), ClusterError> {
        self.keeper.abort();
        let deadline = Instant::now() + CLOSE_TRIES_FOR;
        loop {
            match self.shared.client.lease_revoke(self.lease_id()).await {
                Ok(_) => return Ok(()),
                Err(e) if e.is_lease_not_found() => return Ok(()),
                Err(e) if Instant::now() + RETRY >= deadline => return Err(e.into()),
                Err(e) => {
                    tracing::debug!("revoking the lease: {e}; trying again");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Without `close`, the records go when the lease expires.
        self.keeper.abort();
    }
}

/// Keeps the lease alive every third of its TTL; on a broken stream opens a new one; when etcd
/// says the lease is gone, grants a new one and writes every record again.
async fn keep_alive(shared: Arc<Shared>) {
    let period = shared.options.ttl / 3;
    let c = &shared.client;
    loop {
        let lease = shared.lease.load(Ordering::SeqCst);
        match c.lease_keep_alive(lease).await {
            Ok((keeper, mut stream)) => loop {
                tokio::time::sleep(period).await;
                if keeper.keep_alive().await.is_err() {
                    break;
                }
                match stream.message().await {
                    Ok(Some(reply)) if reply.ttl > 0 => shared.contact(),
                    Ok(Some(_)) => {
                        renew(&shared).await;
                        break;
                    }
                    // The stream ended (a leader change, say): open another.
                    Ok(None) | Err(_) => break,
                }
            },
            // The first reply said the lease is gone, or etcd cannot be reached.
            Err(e) => {
                tracing::warn!("keeping lease {lease:x} alive: {e}");
                if e.is_lease_not_found() {
                    renew(&shared).await;
                } else {
                    tokio::time::sleep(period.min(Duration::from_millis(200))).await;
                }
            }
        }
    }
}

/// A new lease, with every record written on it. Tried again until it is done: a record left
/// unwritten would stay missing until it next changes.
async fn renew(shared: &Shared) {
    let c = &shared.client;
    let records = shared.records.lock().await;
    let mut lease = None;
    let mut written = 0;
    loop {
        if lease.is_none() {
            match c.lease_grant(shared.options.ttl_secs()).await {
                Ok(reply) => {
                    lease = Some(reply.id);
                    shared.lease.store(reply.id, Ordering::SeqCst);
                    written = 0;
                }
                Err(e) => tracing::warn!("granting a new lease: {e}"),
            }
        }
        if let Some(id) = lease {
            for (key, value) in records.iter().skip(written) {
                match c.put(key.as_str(), value.clone(), Some(id)).await {
                    Ok(_) => written += 1,
                    Err(e) => {
                        tracing::warn!("writing {key} again on lease {id:x}: {e}");
                        // The new lease may have expired meanwhile: start over on another.
                        if e.is_lease_not_found() {
                            lease = None;
                        }
                        break;
                    }
                }
            }
            if written == records.len() && lease.is_some() {
                shared.contact();
                tracing::info!(
                    "the lease was lost; {} records written again on a new one",
                    records.len()
                );
                return;
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}
