//! Leases: etcd's Lease service (grant, revoke, and the keep-alive stream).

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::generated::etcdserverpb::{
    LeaseGrantRequest, LeaseGrantResponse, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, LeaseRevokeResponse,
};
use crate::{Client, Error};

/// Keep-alive requests queued before [`LeaseKeeper::keep_alive`] waits for etcd to read them.
const QUEUED_KEEP_ALIVES: usize = 4;

impl Client {
    /// A new lease that lives `ttl_secs` seconds unless kept alive; its id is the reply's `id`
    /// and the time to live etcd chose its `ttl`.
    pub async fn lease_grant(&self, ttl_secs: i64) -> Result<LeaseGrantResponse, Error> {
        let request = LeaseGrantRequest {
            ttl: ttl_secs,
            id: 0,
        };
        let (lease, request) = (&self.lease, &request);
        self.with_token(move || async move {
            Ok(lease.clone().lease_grant(*request).await?.into_inner())
        })
        .await
    }

    /// Ends lease `id` now: every key on it is deleted. A lease already gone fails with
    /// [`Error::is_lease_not_found`].
    pub async fn lease_revoke(&self, id: i64) -> Result<LeaseRevokeResponse, Error> {
        let request = LeaseRevokeRequest { id };
        let (lease, request) = (&self.lease, &request);
        self.with_token(move || async move {
            Ok(lease.clone().lease_revoke(*request).await?.into_inner())
        })
        .await
    }

    /// Opens a keep-alive stream for lease `id` and keeps it alive once: each
    /// [`LeaseKeeper::keep_alive`] then asks for another renewal, answered on the
    /// [`LeaseKeepAliveStream`] with the lease's new time to live (0 once the lease is gone).
    ///
    /// Fails with [`Error::LeaseNotFound`] if etcd's first answer says the lease is gone.
    ///
    /// ```no_run
    /// # async fn example(client: modelmux_etcd::Client) -> Result<(), modelmux_etcd::Error> {
    /// let lease = client.lease_grant(3).await?.id;
    /// let (keeper, mut replies) = client.lease_keep_alive(lease).await?;
    /// loop {
    ///     tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    ///     keeper.keep_alive().await?;
    ///     match replies.message().await? {
    ///         Some(reply) if reply.ttl > 0 => continue,
    ///         _ => break, // the lease is gone, or the stream ended
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lease_keep_alive(
        &self,
        id: i64,
    ) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        self.with_token(|| self.open_keep_alive(id)).await
    }

    async fn open_keep_alive(&self, id: i64) -> Result<(LeaseKeeper, LeaseKeepAliveStream), Error> {
        let (requests, queued) = mpsc::channel(QUEUED_KEEP_ALIVES);
        let keeper = LeaseKeeper { id, requests };
        keeper.keep_alive().await?;
        let mut replies = self
            .lease
            .clone()
            .lease_keep_alive(ReceiverStream::new(queued))
            .await?
            .into_inner();
        match replies.message().await? {
            Some(reply) if reply.ttl > 0 => Ok((keeper, LeaseKeepAliveStream { replies })),
            Some(_) => Err(Error::LeaseNotFound { id }),
            None => Err(Error::StreamEnded("lease keep-alive")),
        }
    }
}

/// Asks etcd to renew one lease, on the stream [`Client::lease_keep_alive`] opened. Dropping it
/// ends the stream.
#[derive(Debug)]
pub struct LeaseKeeper {
    id: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
}

impl LeaseKeeper {
    /// The lease kept alive.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// Asks for one renewal; etcd answers on the [`LeaseKeepAliveStream`].
    pub async fn keep_alive(&self) -> Result<(), Error> {
        self.requests
            .send(LeaseKeepAliveRequest { id: self.id })
            .await
            .map_err(|_| Error::StreamEnded("lease keep-alive"))
    }
}

/// etcd's answers to a [`LeaseKeeper`]'s renewals.
#[derive(Debug)]
pub struct LeaseKeepAliveStream {
    replies: Streaming<LeaseKeepAliveResponse>,
}

impl LeaseKeepAliveStream {
    /// The next answer: the lease's new time to live in `ttl`, 0 if the lease is gone; `None`
    /// once the stream has ended.
    pub async fn message(&mut self) -> Result<Option<LeaseKeepAliveResponse>, Error> {
        Ok(self.replies.message().await?)
    }
}
