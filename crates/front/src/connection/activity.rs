//! What a connection's watchdog needs to tell an idle keep-alive connection from a busy one:
//! requests in progress, and whether bytes moved since it last looked.
//!
//! Moving bytes only bumps a counter: reading the clock on every read and write cost more
//! than the rest of this file on a busy connection. The watchdog looks a few times per
//! timeout instead, so a connection is closed between `keep_alive_timeout` and a quarter more
//! after its last activity.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// One connection's activity.
pub(super) struct Activity {
    /// Bumped whenever bytes move or a request starts or ends.
    events: AtomicU64,
    in_progress: AtomicUsize,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            events: AtomicU64::new(0),
            in_progress: AtomicUsize::new(0),
        }
    }

    fn touch(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request as in progress until the returned guard drops.
    pub(super) fn begin(self: &std::sync::Arc<Self>) -> Busy {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self.clone())
    }
}

/// Looks at a connection's [`Activity`] every quarter of the keep-alive timeout.
pub(super) struct Watchdog {
    timeout: Duration,
    /// The activity counter at the last look.
    seen: u64,
    /// The last look that saw activity (or the connection's start).
    active_at: Instant,
    next_look: Instant,
}

impl Watchdog {
    pub(super) fn new(activity: &Activity, timeout: Duration) -> Self {
        let now = Instant::now();
        Self {
            timeout,
            seen: activity.events.load(Ordering::Relaxed),
            active_at: now,
            next_look: now + Self::every(timeout),
        }
    }

    fn every(timeout: Duration) -> Duration {
        (timeout / 4).max(Duration::from_millis(1))
    }

    /// When to [`look`](Self::look) next.
    pub(super) fn next_look(&self) -> Instant {
        self.next_look
    }

    /// Whether the connection has had no request in progress and no bytes moving for the
    /// timeout (seen at looks a quarter of it apart).
    pub(super) fn look(&mut self, activity: &Activity) -> bool {
        let now = Instant::now();
        self.next_look = now + Self::every(self.timeout);
        let events = activity.events.load(Ordering::Relaxed);
        if events != self.seen || activity.in_progress.load(Ordering::SeqCst) > 0 {
            self.seen = events;
            self.active_at = now;
            return false;
        }
        now.duration_since(self.active_at) >= self.timeout
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// Runs the watchdog's looks as the connection loop does; returns when it calls the
    /// connection idle, measured from the start.
    async fn idle_after(activity: &Activity, timeout: Duration) -> Duration {
        let start = Instant::now();
        let mut watchdog = Watchdog::new(activity, timeout);
        loop {
            tokio::time::sleep_until(watchdog.next_look()).await;
            if watchdog.look(activity) {
                return start.elapsed();
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_connection_is_idle_after_the_timeout() {
        let activity = Activity::new();
        assert_eq!(
            idle_after(&activity, Duration::from_secs(4)).await,
            Duration::from_secs(4)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_moving_put_idleness_off_by_at_most_a_quarter_more() {
        let activity = Arc::new(Activity::new());
        let timeout = Duration::from_secs(4);
        // Bytes move once, 0.1 s in: idle no sooner than 4.1 s, no later than 5.1 s.
        let mover = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            mover.touch();
        });
        let idle = idle_after(&activity, timeout).await;
        assert!(
            idle >= Duration::from_millis(4100) && idle <= Duration::from_millis(5100),
            "{idle:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_progress_is_never_idle() {
        let activity = Arc::new(Activity::new());
        let busy = activity.begin();
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            idle_after(&activity, Duration::from_secs(1)),
        )
        .await;
        assert!(waited.is_err(), "idle while a request was in progress");
        drop(busy);
        assert_eq!(
            idle_after(&activity, Duration::from_secs(1)).await,
            Duration::from_secs(1)
        );
    }
}
