//! Following changes: etcd's Watch service, one watch per stream.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

use crate::generated::etcdserverpb::watch_request::RequestUnion;
use crate::generated::etcdserverpb::{
    WatchCancelRequest, WatchCreateRequest, WatchProgressRequest, WatchRequest, WatchResponse,
};
use crate::kv::prefix_range;
use crate::{Client, Error};

/// Requests (a cancel, a progress request) queued before [`Watcher`] waits for etcd to read them.
const QUEUED_REQUESTS: usize = 4;

/// What a watch follows, and from when. By default: one key, from the next change.
#[derive(Debug, Clone, Default)]
pub struct WatchOptions {
    prefix: bool,
    start_revision: i64,
    progress_notify: bool,
}

impl WatchOptions {
    /// One key, from the next change.
    pub fn new() -> Self {
        Self::default()
    }

    /// Follows every key that starts with the key given, not that key alone.
    pub fn with_prefix(mut self) -> Self {
        self.prefix = true;
        self
    }

    /// Starts at `revision` (inclusive): every change since then is sent first. If the history
    /// before it was compacted, etcd cancels the watch instead, with
    /// [`compact_revision`](WatchResponse::compact_revision) set.
    pub fn with_start_revision(mut self, revision: i64) -> Self {
        self.start_revision = revision;
        self
    }

    /// Asks etcd to send, while nothing changes, an answer with no events from time to time:
    /// its header's revision says every change up to it was sent.
    pub fn with_progress_notify(mut self) -> Self {
        self.progress_notify = true;
        self
    }

    fn create_request(&self, key: Vec<u8>) -> WatchCreateRequest {
        let (key, range_end) = if self.prefix {
            prefix_range(key)
        } else {
            (key, Vec::new())
        };
        WatchCreateRequest {
            key,
            range_end,
            start_revision: self.start_revision,
            progress_notify: self.progress_notify,
            ..WatchCreateRequest::default()
        }
    }
}

impl Client {
    /// Watches `key` (or, [`with_prefix`](WatchOptions::with_prefix), every key under it) on a
    /// stream of its own. Returns once etcd has created the watch: the [`Watcher`] cancels it
    /// or asks for progress, the [`WatchStream`] brings its events. Keep the watcher while
    /// reading: dropping it closes the sending half of the stream.
    ///
    /// ```no_run
    /// # async fn example(client: modelmux_etcd::Client) -> Result<(), modelmux_etcd::Error> {
    /// use modelmux_etcd::{EventType, WatchOptions};
    ///
    /// let options = WatchOptions::new().with_prefix().with_progress_notify();
    /// let (_watcher, mut stream) = client.watch("modelmux/", options).await?;
    /// while let Some(reply) = stream.message().await? {
    ///     if reply.canceled {
    ///         break; // e.g. the start was compacted away: read again, then watch again
    ///     }
    ///     for event in &reply.events {
    ///         let Some(kv) = &event.kv else { continue };
    ///         match event.r#type() {
    ///             EventType::Put => println!("set {:?}", kv.key),
    ///             EventType::Delete => println!("deleted {:?}", kv.key),
    ///         }
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn watch(
        &self,
        key: impl Into<Vec<u8>>,
        options: WatchOptions,
    ) -> Result<(Watcher, WatchStream), Error> {
        let create = options.create_request(key.into());
        // etcd refuses a watch whose token expired as it refuses one it does not permit: a
        // new token is asked for, and the watch tried once more.
        self.with_token(|| self.open_watch(create.clone())).await
    }

    async fn open_watch(
        &self,
        create: WatchCreateRequest,
    ) -> Result<(Watcher, WatchStream), Error> {
        let (requests, queued) = mpsc::channel(QUEUED_REQUESTS);
        let create = RequestUnion::CreateRequest(create);
        let watcher = Watcher { id: 0, requests };
        watcher.send(create).await?;
        let mut events = self
            .watch
            .clone()
            .watch(ReceiverStream::new(queued))
            .await?
            .into_inner();
        // etcd answers a create first (events for the watch wait until it has): that answer
        // carries the watch's id, or why etcd refused it.
        match events.message().await? {
            Some(created) if created.canceled => Err(Error::WatchRefused {
                reason: created.cancel_reason,
            }),
            Some(created) => Ok((
                Watcher {
                    id: created.watch_id,
                    ..watcher
                },
                WatchStream { events },
            )),
            None => Err(Error::StreamEnded("watch")),
        }
    }
}

/// Controls one watch: cancels it or asks where it is.
#[derive(Debug)]
pub struct Watcher {
    id: i64,
    requests: mpsc::Sender<WatchRequest>,
}

impl Watcher {
    /// The watch's id on its stream.
    pub fn watch_id(&self) -> i64 {
        self.id
    }

    /// Cancels the watch: etcd answers with `canceled` set and sends no more events.
    pub async fn cancel(&self) -> Result<(), Error> {
        let cancel = WatchCancelRequest { watch_id: self.id };
        self.send(RequestUnion::CancelRequest(cancel)).await
    }

    /// Asks etcd for a progress answer now (no events; its header's revision says every change
    /// up to it was sent).
    pub async fn request_progress(&self) -> Result<(), Error> {
        self.send(RequestUnion::ProgressRequest(WatchProgressRequest {}))
            .await
    }

    async fn send(&self, request: RequestUnion) -> Result<(), Error> {
        let request = WatchRequest {
            request_union: Some(request),
        };
        self.requests
            .send(request)
            .await
            .map_err(|_| Error::StreamEnded("watch"))
    }
}

/// A watch's answers: events, progress notices, and at last a cancellation.
#[derive(Debug)]
pub struct WatchStream {
    events: Streaming<WatchResponse>,
}

impl WatchStream {
    /// The next answer: `events` in revision order (empty in a progress notice), or `canceled`
    /// with a reason (and `compact_revision` set if the start was compacted away); `None` once
    /// the stream has ended.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Error> {
        Ok(self.events.message().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_watch_covers_the_keys_under_it() {
        let request = WatchOptions::new()
            .with_prefix()
            .with_start_revision(8)
            .with_progress_notify()
            .create_request(b"mm/".to_vec());
        assert_eq!(request.key, b"mm/");
        assert_eq!(request.range_end, b"mm0");
        assert_eq!(request.start_revision, 8);
        assert!(request.progress_notify);

        let one_key = WatchOptions::new().create_request(b"mm/a".to_vec());
        assert_eq!(one_key.key, b"mm/a");
        assert!(one_key.range_end.is_empty());
        assert_eq!(one_key.start_revision, 0);
        assert!(!one_key.progress_notify);
    }
}
