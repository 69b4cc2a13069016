//! Background tasks that outlive their own panics.
//!
//! A node's lease keeper and view follower must run as long as the process does: if one died
//! (a bug, or a panic in a dependency), the node would lose its lease or route on a frozen view
//! while looking healthy. So each runs under a loop that starts it again after a panic.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinHandle;

/// How long after a panic the task is started again.
const RESTART_AFTER: Duration = Duration::from_millis(100);

/// Spawns `make()`'s future, and a fresh one each time it panics. It ends when a run returns,
/// or when the handle is aborted.
pub(crate) fn spawn_restarting<F, Fut>(name: &'static str, make: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            match AssertUnwindSafe(make()).catch_unwind().await {
                Ok(()) => return,
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(task = name, "panicked ({what}); starting it again");
                    tokio::time::sleep(RESTART_AFTER).await;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_is_started_again_until_it_returns() {
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let task = spawn_restarting("test", move || {
            let runs = counted.clone();
            async move {
                if runs.fetch_add(1, Ordering::SeqCst) < 2 {
                    panic!("run failed");
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("ends once a run returns")
            .expect("never fails itself");
        assert_eq!(runs.load(Ordering::SeqCst), 3);
    }
}
