//! What a connection's watchdog needs to enforce the two HTTP/1 timeouts the front door owns:
//! requests in progress, whether bytes moved since it last looked, and whether the bytes of a
//! request head have started to arrive.
//!
//! - `keep_alive_timeout`: no request in progress and no bytes moving for it: the connection
//!   is idle.
//! - `header_read_timeout`: a request head not complete within it, counted from the
//!   connection's start for its first request and from the first byte of each later one (an
//!   idle keep-alive connection between requests is the keep-alive timeout's). HTTP/2
//!   connections (the cluster's forwarding, recognised by their preface) have no such limit:
//!   their idleness is counted in streams (no stream open or begun for `keep_alive_timeout`),
//!   not in bytes, since pings and their answers move bytes on a connection nobody uses.
//!
//! hyper can enforce the second itself, but arms a timer for every request head it waits for
//! (a boxed `Sleep` in tokio's timer wheel, and a clock read): in a profile of
//! `scripts/bench-serve`'s scenario (a) 2-3% of the server's CPU, and a bare hyper server
//! used 1.0-1.5 µs more CPU a request with it than without (7%). Moving bytes only bumps a
//! counter here (reading the clock on every read and write cost more than the rest of this
//! file on a busy connection), a read of a head's bytes sets a flag, and the watchdog looks a
//! few times per timeout instead: a connection is closed between a timeout and a quarter of
//! the shorter timeout more after it ran out.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// The first bytes of every HTTP/2 connection without TLS.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// One connection's activity.
pub(super) struct Activity {
    /// Bumped whenever bytes move or a request starts or ends.
    events: AtomicU64,
    in_progress: AtomicUsize,
    /// Requests begun so far.
    begun: AtomicU64,
    /// Writes that moved bytes so far.
    writes: AtomicU64,
    /// Bytes arrived while no request was in progress, since the last request began: a head
    /// is on its way.
    head_bytes: AtomicBool,
    /// The connection opened with HTTP/2's preface.
    h2: AtomicBool,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            events: AtomicU64::new(0),
            in_progress: AtomicUsize::new(0),
            begun: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            head_bytes: AtomicBool::new(false),
            h2: AtomicBool::new(false),
        }
    }

    fn touch(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes were read: the head of the next request, when none is in progress.
    fn read(&self) {
        self.touch();
        if self.in_progress.load(Ordering::SeqCst) == 0 && !self.head_bytes.load(Ordering::Relaxed)
        {
            self.head_bytes.store(true, Ordering::Relaxed);
        }
    }

    /// Bytes were written.
    fn wrote(&self) {
        self.touch();
        self.writes.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request as in progress until the returned guard drops (its head has arrived).
    pub(super) fn begin(self: &std::sync::Arc<Self>) -> Busy {
        self.in_progress.fetch_add(1, Ordering::SeqCst);
        self.head_bytes.store(false, Ordering::Relaxed);
        self.begun.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self.clone())
    }
}

/// What a look at a connection found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Look {
    /// Nothing to do.
    Fine,
    /// No request in progress and no bytes moving for the keep-alive timeout.
    Idle,
    /// A request head still incomplete after the header read timeout, with no request in
    /// progress and nothing written meanwhile: the connection is to be dropped (hyper's
    /// graceful shutdown waits for a head whose bytes keep arriving: 200 clients dripping a
    /// byte every 100 ms were all still connected 10 s later).
    SlowHead,
}

/// Looks at a connection's [`Activity`] every quarter of the shorter of its two timeouts.
pub(super) struct Watchdog {
    keep_alive: Duration,
    header_read: Duration,
    /// The activity counter at the last look.
    seen: u64,
    /// The last look that saw activity (or the connection's start).
    active_at: Instant,
    /// Requests begun, at the last look.
    begun: u64,
    /// Writes, at the last look.
    writes: u64,
    /// Since when a request head has been on its way: the connection's start for the first,
    /// the first look that saw its bytes for later ones.
    head_since: Option<Instant>,
    next_look: Instant,
}

impl Watchdog {
    pub(super) fn new(activity: &Activity, keep_alive: Duration, header_read: Duration) -> Self {
        let now = Instant::now();
        let begun = activity.begun.load(Ordering::SeqCst);
        let watchdog = Self {
            keep_alive,
            header_read,
            seen: activity.events.load(Ordering::Relaxed),
            active_at: now,
            begun,
            writes: activity.writes.load(Ordering::Relaxed),
            // A new connection owes its first head from now.
            head_since: (begun == 0).then_some(now),
            next_look: now,
        };
        Self {
            next_look: now + watchdog.every(),
            ..watchdog
        }
    }

    fn every(&self) -> Duration {
        (self.keep_alive.min(self.header_read) / 4).max(Duration::from_millis(1))
    }

    /// When to [`look`](Self::look) next.
    pub(super) fn next_look(&self) -> Instant {
        self.next_look
    }

    /// Whether the connection is idle, or its request head is late (seen at looks a quarter
    /// of the shorter timeout apart).
    pub(super) fn look(&mut self, activity: &Activity) -> Look {
        let now = Instant::now();
        self.next_look = now + self.every();
        let busy = activity.in_progress.load(Ordering::SeqCst) > 0;
        let begun = activity.begun.load(Ordering::SeqCst);
        let h2 = activity.h2.load(Ordering::Relaxed);
        let started = begun != self.begun;
        if busy || started || h2 {
            self.begun = begun;
            self.head_since = None;
        }
        // The clock of a later head restarts while the connection writes: a response still
        // streaming to a client that sent its next request early (pipelining) is not cut.
        let writes = activity.writes.load(Ordering::Relaxed);
        let writing = writes != self.writes;
        self.writes = writes;
        if !busy
            && activity.head_bytes.load(Ordering::Relaxed)
            && (self.head_since.is_none() || writing)
        {
            self.head_since = Some(now);
        }
        // A connection whose head has begun to arrive is the header read timeout's, however
        // quiet it has gone: closing it as idle would be a graceful shutdown, which hyper holds
        // open until that head completes, that is, for as long as the client likes.
        let head_begun = !busy && activity.head_bytes.load(Ordering::Relaxed) && !h2;
        // On HTTP/2 only streams count: frames move on a connection that never opens one (the
        // server's own keep-alive pings and their answers, SETTINGS, WINDOW_UPDATE), and a peer
        // that only answers pings would otherwise hold its connection, and a connection permit,
        // for ever.
        let events = activity.events.load(Ordering::Relaxed);
        let moved = if h2 { started } else { events != self.seen };
        if moved || busy {
            self.seen = events;
            self.active_at = now;
        } else if !head_begun && now.duration_since(self.active_at) >= self.keep_alive {
            return Look::Idle;
        }
        match self.head_since {
            Some(since) if now.duration_since(since) >= self.header_read => Look::SlowHead,
            _ => Look::Fine,
        }
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
    /// Bytes of HTTP/2's preface the connection's first bytes matched, while they match.
    preface: Option<usize>,
}

impl<S> Watched<S> {
    pub(super) fn new(inner: S, activity: std::sync::Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            preface: Some(0),
        }
    }

    /// Compares the connection's first bytes with HTTP/2's preface.
    fn first_bytes(&mut self, bytes: &[u8]) {
        let Some(matched) = self.preface else { return };
        let n = bytes.len().min(H2_PREFACE.len() - matched);
        if bytes[..n] != H2_PREFACE[matched..matched + n] {
            self.preface = None;
        } else if matched + n == H2_PREFACE.len() {
            self.preface = None;
            self.activity.h2.store(true, Ordering::Relaxed);
        } else {
            self.preface = Some(matched + n);
        }
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
            this.activity.read();
            if this.preface.is_some() {
                this.first_bytes(&buf.filled()[before..]);
            }
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
            this.activity.wrote();
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
            this.activity.wrote();
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

    const LONG: Duration = Duration::from_secs(3600);

    /// Runs the watchdog's looks as the connection loop does; returns what the first look
    /// that was not fine found, and when, measured from the start.
    async fn until(
        activity: &Activity,
        keep_alive: Duration,
        header_read: Duration,
    ) -> (Look, Duration) {
        let start = Instant::now();
        let mut watchdog = Watchdog::new(activity, keep_alive, header_read);
        loop {
            tokio::time::sleep_until(watchdog.next_look()).await;
            match watchdog.look(activity) {
                Look::Fine => {}
                found => return (found, start.elapsed()),
            }
        }
    }

    async fn idle_after(activity: &Activity, timeout: Duration) -> Duration {
        let (found, after) = until(activity, timeout, LONG).await;
        assert_eq!(found, Look::Idle);
        after
    }

    /// After `delay`, calls `f` on `activity` every 100 ms, `times` times.
    fn every_tenth(
        activity: &Arc<Activity>,
        delay: Duration,
        times: usize,
        f: impl Fn(&Activity) + Send + 'static,
    ) {
        let activity = activity.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            for _ in 0..times {
                f(&activity);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }

    /// Asserts the watchdog finds a late head, between `from` and `to` after its start.
    async fn slow_head_between(
        activity: &Activity,
        header_read: Duration,
        from: Duration,
        to: Duration,
    ) {
        let (found, after) = until(activity, LONG, header_read).await;
        assert_eq!(found, Look::SlowHead);
        assert!(after >= from && after <= to, "{after:?}");
    }

    /// A request that has come and gone (its head arrived, its response was written).
    fn one_request(activity: &Arc<Activity>) {
        activity.read();
        drop(activity.begin());
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
            until(&activity, Duration::from_secs(1), Duration::from_secs(1)),
        )
        .await;
        assert!(waited.is_err(), "cut off while a request was in progress");
        drop(busy);
        assert_eq!(
            idle_after(&activity, Duration::from_secs(1)).await,
            Duration::from_secs(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_first_head_that_never_completes_is_cut_off_from_the_start() {
        let activity = Arc::new(Activity::new());
        // Half a head, then a byte every 100 ms: never idle, never a request.
        every_tenth(&activity, Duration::ZERO, usize::MAX, Activity::read);
        let two = Duration::from_secs(2);
        slow_head_between(&activity, two, two, Duration::from_millis(2500)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_that_stops_arriving_is_late_not_idle() {
        // The defaults: the keep-alive timeout (5 s) is shorter than the header read
        // timeout (10 s). Half a head arrives at once, then nothing: idle by the first rule,
        // but closing it as idle is a graceful shutdown that waits for the head forever.
        for later in [false, true] {
            let activity = Arc::new(Activity::new());
            if later {
                one_request(&activity);
            }
            activity.read();
            let (found, after) =
                until(&activity, Duration::from_secs(5), Duration::from_secs(10)).await;
            assert_eq!(
                found,
                Look::SlowHead,
                "later head: {later}, after {after:?}"
            );
            let (from, to) = (Duration::from_secs(10), Duration::from_millis(12_500));
            assert!(
                after >= from && after <= to,
                "later head: {later}, {after:?}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_later_head_is_timed_from_its_first_byte() {
        let activity = Arc::new(Activity::new());
        one_request(&activity);
        // Quiet for 10 s between requests (longer than the header timeout, shorter than the
        // keep-alive one), then a head that starts and never ends.
        every_tenth(
            &activity,
            Duration::from_secs(10),
            usize::MAX,
            Activity::read,
        );
        let (from, to) = (Duration::from_secs(12), Duration::from_millis(13_000));
        slow_head_between(&activity, Duration::from_secs(2), from, to).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_response_still_streaming_is_not_a_late_head() {
        let activity = Arc::new(Activity::new());
        one_request(&activity);
        // The response's body keeps being written for a minute; nothing is read.
        every_tenth(&activity, Duration::ZERO, 600, Activity::wrote);
        let (found, after) = until(&activity, Duration::from_secs(1), Duration::from_secs(1)).await;
        assert_eq!(found, Look::Idle, "cut off after {after:?}");
        assert!(after >= Duration::from_secs(60), "{after:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn an_early_next_request_waits_while_the_response_streams() {
        let activity = Arc::new(Activity::new());
        one_request(&activity);
        // The client sends its next request at once (pipelining) while the response's body
        // is written for 10 s; then nothing more is written, and the head never completes.
        activity.read();
        every_tenth(&activity, Duration::ZERO, 100, Activity::wrote);
        let (from, to) = (Duration::from_secs(12), Duration::from_millis(13_000));
        slow_head_between(&activity, Duration::from_secs(2), from, to).await;
    }

    #[tokio::test(start_paused = true)]
    async fn http2_connections_have_no_header_timeout() {
        let activity = Arc::new(Activity::new());
        let mut watched = Watched::new(tokio::io::empty(), activity.clone());
        watched.first_bytes(&H2_PREFACE[..10]);
        assert!(!activity.h2.load(Ordering::Relaxed));
        watched.first_bytes(&H2_PREFACE[10..]);
        assert!(activity.h2.load(Ordering::Relaxed));
        // A stream stays open for a minute while frames move: neither idle nor a late head.
        let stream = activity.begin();
        every_tenth(&activity, Duration::ZERO, usize::MAX, Activity::read);
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            until(&activity, Duration::from_secs(1), Duration::from_secs(1)),
        )
        .await;
        assert!(
            waited.is_err(),
            "an HTTP/2 connection was cut off: {waited:?}"
        );
        drop(stream);
        // No stream now, frames (pings and their answers) still moving: idle after the
        // keep-alive timeout, never a late head.
        let (found, after) = until(&activity, Duration::from_secs(4), Duration::from_secs(1)).await;
        assert_eq!(found, Look::Idle);
        assert!(
            after >= Duration::from_secs(4) && after <= Duration::from_millis(5250),
            "{after:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn http2_streams_begun_keep_a_connection_as_bytes_do_not() {
        let activity = Arc::new(Activity::new());
        activity.h2.store(true, Ordering::Relaxed);
        // A short stream every 500 ms for 10 s, frames all the time: not idle until the
        // streams stop.
        every_tenth(&activity, Duration::ZERO, usize::MAX, Activity::read);
        let streams = activity.clone();
        tokio::spawn(async move {
            for _ in 0..20 {
                drop(streams.begin());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        let (found, after) = until(&activity, Duration::from_secs(2), Duration::from_secs(1)).await;
        assert_eq!(found, Look::Idle);
        assert!(after >= Duration::from_secs(11), "{after:?}");
    }

    #[test]
    fn only_the_whole_preface_makes_a_connection_http2() {
        for first in [&b"GET / HTTP/1.1\r\n"[..], b"PRI * HTTP/1.1\r\n", b"P", b""] {
            let activity = Arc::new(Activity::new());
            let mut watched = Watched::new(tokio::io::empty(), activity.clone());
            watched.first_bytes(first);
            watched.first_bytes(b"GET / HTTP/1.1\r\n");
            assert!(!activity.h2.load(Ordering::Relaxed), "{first:?}");
        }
    }
}
