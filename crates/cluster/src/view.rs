//! Every record under a prefix, followed as it changes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use modelmux_etcd::{Client, EventType, WatchOptions};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::ClusterError;
use crate::supervise::spawn_restarting;

/// Keys and values under one prefix.
pub type Records = BTreeMap<String, Vec<u8>>;

/// The records under a prefix as etcd has them: one read at revision R, then a watch from
/// R + 1 applying every change the moment etcd sends it; after a compaction (the watch start
/// was compacted away) or a broken stream, read again and watch from there.
pub struct View {
    records: watch::Receiver<Arc<Records>>,
    task: JoinHandle<()>,
}

impl View {
    /// Reads the records under `prefix` once, then follows them.
    pub async fn start(client: Client, prefix: &str) -> Result<Self, ClusterError> {
        let (records, revision) = read(&client, prefix).await?;
        let (tx, rx) = watch::channel(Arc::new(records));
        let prefix = prefix.to_owned();
        let (first, tx) = (parking_lot::Mutex::new(Some(revision)), Arc::new(tx));
        // Started again after a panic, it reads everything afresh before watching.
        let task = spawn_restarting("view follower", move || {
            let start = first.lock().take();
            follow(client.clone(), prefix.clone(), start, tx.clone())
        });
        Ok(Self { records: rx, task })
    }

    /// The records now.
    pub fn records(&self) -> Arc<Records> {
        self.records.borrow().clone()
    }

    /// Waits until the records change. (The task following etcd is started again if it
    /// panics; should it be gone all the same, this never returns, so a caller looping on it
    /// cannot spin.)
    pub async fn changed(&mut self) {
        if self.records.changed().await.is_err() {
            tracing::error!("the view's follower stopped; routing stays on the last records");
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for View {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read(c: &Client, prefix: &str) -> Result<(Records, i64), ClusterError> {
    let reply = c.get_prefix(prefix).await?;
    let revision = reply.header.map_or(0, |h| h.revision);
    let records = reply
        .kvs
        .into_iter()
        .map(|kv| (String::from_utf8_lossy(&kv.key).into_owned(), kv.value))
        .collect();
    Ok((records, revision))
}

/// Watches from `revision + 1`, or (with no revision) reads everything first; reads again
/// whenever the watch ends.
async fn follow(
    client: Client,
    prefix: String,
    revision: Option<i64>,
    tx: Arc<watch::Sender<Arc<Records>>>,
) {
    let mut revision = match revision {
        Some(r) => r,
        None => read_until_done(&client, &prefix, &tx).await,
    };
    loop {
        // Progress notifications move the revision on while nothing under the prefix changes,
        // so a watch started again later starts nearer to now.
        let options = WatchOptions::new()
            .with_prefix()
            .with_progress_notify()
            .with_start_revision(revision + 1);
        // The watcher is held while the stream is read (dropping it would close the stream's
        // sending half).
        match client.watch(prefix.as_str(), options).await {
            Ok((_watcher, mut stream)) => loop {
                match stream.message().await {
                    Ok(Some(reply)) if reply.canceled => {
                        if reply.compact_revision > 0 {
                            tracing::info!("the watch on {prefix} was compacted; reading again");
                        }
                        break;
                    }
                    Ok(Some(reply)) => {
                        if reply.events.is_empty() {
                            // A progress notification: every change up to its revision was
                            // sent.
                            if let Some(header) = reply.header {
                                revision = revision.max(header.revision);
                            }
                            continue;
                        }
                        let mut records = Records::clone(&tx.borrow());
                        for event in &reply.events {
                            let Some(kv) = &event.kv else { continue };
                            let key = String::from_utf8_lossy(&kv.key).into_owned();
                            match event.r#type() {
                                EventType::Put => {
                                    records.insert(key, kv.value.clone());
                                }
                                EventType::Delete => {
                                    records.remove(&key);
                                }
                            }
                            revision = revision.max(kv.mod_revision);
                        }
                        tx.send_replace(Arc::new(records));
                    }
                    Ok(None) | Err(_) => break,
                }
            },
            Err(e) => tracing::warn!("watching {prefix}: {e}"),
        }
        // Read everything again and watch from there: no change is lost, however the watch ended.
        revision = read_until_done(&client, &prefix, &tx).await;
    }
}

/// Reads every record under `prefix` (trying again until etcd answers), publishes them, and
/// returns the revision they are at.
async fn read_until_done(c: &Client, prefix: &str, tx: &watch::Sender<Arc<Records>>) -> i64 {
    loop {
        match read(c, prefix).await {
            Ok((records, at)) => {
                tx.send_replace(Arc::new(records));
                return at;
            }
            Err(e) => {
                tracing::warn!("reading {prefix}: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LocalEtcd;

    /// A watch whose start revision was compacted away is cancelled by etcd; the follower
    /// then reads everything afresh (this happens when a compaction falls between the view's
    /// read and its watch, so it is driven here directly).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_watch_from_a_compacted_revision_is_followed_by_a_fresh_read() {
        let etcd = LocalEtcd::start(1).await.expect("etcd must be installed");
        let client = crate::connect(&etcd.endpoints()).await.unwrap();
        let writer = client.clone();
        let old = writer.put("mm/a", "1", None).await.unwrap();
        let stale_revision = old.header.unwrap().revision;
        let (stale, _) = read(&writer, "mm/").await.unwrap();
        writer.put("mm/b", "2", None).await.unwrap();
        writer.delete("mm/a").await.unwrap();
        let last = writer.put("mm/c", "3", None).await.unwrap();
        writer
            .compact(last.header.unwrap().revision, false)
            .await
            .unwrap();

        let (tx, mut rx) = watch::channel(Arc::new(stale));
        let task = tokio::spawn(follow(
            client,
            "mm/".into(),
            Some(stale_revision),
            Arc::new(tx),
        ));
        let expected: Records = [("mm/b", "2"), ("mm/c", "3")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.as_bytes().to_vec()))
            .collect();
        let caught_up = tokio::time::timeout(Duration::from_secs(5), async {
            while **rx.borrow_and_update() != expected {
                rx.changed().await.unwrap();
            }
        })
        .await;
        task.abort();
        assert!(caught_up.is_ok(), "still {:?}", rx.borrow());
    }
}
