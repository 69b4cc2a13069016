//! What a connection's watchdog needs to tell an idle keep-alive connection from a busy one:
//! requests in progress, and when bytes last moved either way.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// One connection's activity.
pub(super) struct Activity {
    opened: Instant,
    /// Nanoseconds after `opened` that bytes last moved, or a request started or ended.
    last: AtomicU64,
    in_progress: AtomicUsize,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            opened: Instant::now(),
            last: AtomicU64::new(0),
            in_progress: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        let nanos = self.opened.elapsed().as_nanos();
        self.last
            .store(u64::try_from(nanos).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.opened + Duration::from_nanos(self.last.load(Ordering::Relaxed))
    }

    /// Counts a request as in progress until the returned guard drops.
    pub(super) fn begin(self: &std::sync::Arc<Self>) -> Busy {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self.clone())
    }

    /// When the connection becomes idle for `timeout` if nothing happens before then.
    pub(super) fn idle_deadline(&self, timeout: Duration) -> Instant {
        self.last() + timeout
    }

    /// Whether no request is in progress and nothing moved for `timeout`.
    pub(super) fn is_idle_since(&self, timeout: Duration) -> bool {
        self.in_progress.load(Ordering::SeqCst) == 0 && self.last().elapsed() >= timeout
    }
}

/// A request in progress on a connection.
pub(super) struct Busy(std::sync::Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_progress.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A stream that records its activity on every read and write that moves bytes.
pub(super) struct Watched<S> {
    inner: S,
    activity: std::sync::Arc<Activity>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, activity: std::sync::Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let poll = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.touch();
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        poll
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(poll, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.touch();
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
