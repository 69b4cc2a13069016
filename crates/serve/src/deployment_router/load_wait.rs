//! A request that waits for its model's load gives its replica slot back meanwhile.

use std::sync::atomic::Ordering;
use std::task::Poll;

use super::Ongoing;

/// Awaits `load` (a deployment's wait for a model, such as `Multiplexer::get`), giving the
/// request's replica slot back while the model loads and taking it back, ahead of newcomers,
/// once it has: a request waiting for a load uses no inference capacity, so it must not keep
/// requests for the replica's loaded models waiting (Ray counts it against
/// `max_ongoing_requests`, which saturates replicas with loads under model churn). The replica
/// still counts it as inside (a drain waits for it). A `load` that is ready at once (the model
/// was loaded) gives nothing back. Outside a request dispatched by this server it is
/// `load.await`.
pub async fn waiting_for_load<F: std::future::Future>(load: F) -> F::Output {
    let mut load = std::pin::pin!(load);
    let first = std::future::poll_fn(|cx| Poll::Ready(load.as_mut().poll(cx))).await;
    if let Poll::Ready(out) = first {
        return out;
    }
    // A load (or the wait for one): a span of the request's trace, when it is sampled.
    let span = modelmux_context::span("model_load").map(|mut span| {
        if let Some(model) = modelmux_context::multiplexed_model_id() {
            span.attribute("model_id", model.as_str());
        }
        span
    });
    let out = wait_out(load).await;
    if let Some(span) = span {
        span.end(false);
    }
    out
}

/// The rest of [`waiting_for_load`] once the load turned out not to be ready: the slot is
/// given back while it runs.
async fn wait_out<F: std::future::Future>(load: std::pin::Pin<&mut F>) -> F::Output {
    let hold = modelmux_context::current_hold();
    let Some(ongoing) = hold.as_ref().and_then(|h| h.claim::<Ongoing>()) else {
        return load.await;
    };
    if ongoing.suspended.swap(true, Ordering::SeqCst) {
        // Already given back by an outer wait.
        return load.await;
    }
    ongoing.target.slot().suspend(ongoing.model.as_ref());
    ongoing.router.grant();
    let suspension = Suspension(ongoing);
    let out = load.await;
    ongoing.target.slot().resume(ongoing.model.as_ref()).await;
    ongoing.suspended.store(false, Ordering::SeqCst);
    drop(suspension);
    out
}

/// Ends a suspension: if the wait was cancelled before the slot was taken back (the request
/// goes on without its load, or is being dropped), the slot is taken back at once, so the
/// request never runs without one. Either way the queue is offered what may have freed (a
/// resumer blocks newcomers while it waits).
struct Suspension<'a>(&'a Ongoing);

impl Drop for Suspension<'_> {
    fn drop(&mut self) {
        if self.0.suspended.swap(false, Ordering::SeqCst) {
            self.0.target.slot().force_resume(self.0.model.as_ref());
        }
        self.0.router.grant();
    }
}
