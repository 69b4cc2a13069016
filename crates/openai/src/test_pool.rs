//! For tests: whether a future does its work on the async worker that polls it, or sends it
//! to the blocking pool. The runtime has one blocking thread, held while the future is first
//! polled, so work sent there cannot finish before that poll: a future that is ready at once
//! did its work inline.

use std::future::Future;
use std::task::Poll;

/// A current-thread runtime with one blocking thread.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Whether `f` was ready at its first poll, with the blocking thread held (on a [`runtime`]),
/// and its output.
pub(crate) async fn ran_inline<F: Future>(f: F) -> (bool, F::Output) {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let blocker = tokio::task::spawn_blocking(move || {
        let _ = held.recv();
    });
    let mut f = std::pin::pin!(f);
    let first = std::future::poll_fn(|cx| Poll::Ready(f.as_mut().poll(cx))).await;
    let _ = release.send(());
    blocker.await.unwrap();
    match first {
        Poll::Ready(out) => (true, out),
        Poll::Pending => (false, f.await),
    }
}
