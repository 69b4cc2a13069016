//! The registry and the view against a real etcd (Debian's `etcd-server`, started on free
//! loopback ports by `LocalEtcd`): records appear in a view, go when deleted, go with the
//! lease when their process stops keeping it (not before), come back on a new lease when etcd
//! lets the old one expire, and a view follows changes across a compaction. (A watch whose
//! start revision was compacted away is tested in `view.rs`.) Waits are bounded generously
//! ([`WAIT`]); what is asserted is what etcd holds, and the order things happen in.

use std::time::Duration;

use modelmux_cluster::{LocalEtcd, Registry, RegistryOptions, View};
use modelmux_etcd::Client;
use tokio::time::Instant;

async fn etcd() -> (LocalEtcd, Client) {
    let etcd = LocalEtcd::start(1).await.expect("etcd must be installed");
    let client = modelmux_cluster::connect(&etcd.endpoints()).await.unwrap();
    (etcd, client)
}

/// How long a test waits for what it expects before failing: far longer than any step it
/// waits for (a watch event: milliseconds; a lease TTL here: 2 s).
const WAIT: Duration = Duration::from_secs(20);

/// Waits (at most [`WAIT`]) until the view's records satisfy `ok`.
async fn until(view: &mut View, ok: impl Fn(&modelmux_cluster::Records) -> bool) {
    let start = Instant::now();
    while !ok(&view.records()) {
        let left = WAIT.saturating_sub(start.elapsed());
        assert!(!left.is_zero(), "not within {WAIT:?}: {:?}", view.records());
        let _ = tokio::time::timeout(left, view.changed()).await;
    }
}

/// Whether etcd holds `key` now, and on which lease.
async fn lease_of(client: &Client, key: &str) -> Option<i64> {
    let reply = client.get(key).await.unwrap();
    reply.kvs.first().map(|kv| kv.lease)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_appear_go_and_follow_their_lease() {
    let (_etcd, client) = etcd().await;
    let mut view = View::start(client.clone(), "mm/").await.unwrap();
    assert!(view.records().is_empty());

    let ttl = Duration::from_secs(2);
    let a = Registry::start(client.clone(), RegistryOptions::with_ttl(ttl))
        .await
        .unwrap();
    a.put("mm/nodes/a", "node a").await.unwrap();
    a.put("mm/models/x/a", "loaded").await.unwrap();
    assert_eq!(lease_of(&client, "mm/nodes/a").await, Some(a.lease_id()));
    until(&mut view, |r| r.len() == 2).await;
    assert_eq!(view.records()["mm/nodes/a"], b"node a");
    a.delete("mm/models/x/a").await.unwrap();
    until(&mut view, |r| !r.contains_key("mm/models/x/a")).await;

    // Kept alive past its TTL: still there, on the same lease.
    tokio::time::sleep(ttl * 2).await;
    assert!(
        view.records().contains_key("mm/nodes/a"),
        "the lease was kept alive"
    );
    assert_eq!(lease_of(&client, "mm/nodes/a").await, Some(a.lease_id()));

    // etcd lets the lease go (as after a long partition): the records come back on a new one.
    let old = a.lease_id();
    client.lease_revoke(old).await.unwrap();
    assert_eq!(lease_of(&client, "mm/nodes/a").await, None, "went with it");
    let deadline = Instant::now() + WAIT;
    while a.lease_id() == old {
        assert!(Instant::now() < deadline, "no new lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until(&mut view, |r| r.contains_key("mm/nodes/a") && r.len() == 1).await;
    assert_eq!(lease_of(&client, "mm/nodes/a").await, Some(a.lease_id()));

    // A process that stops keeping its lease (it died): its records stay while the lease
    // lasts, and go with it.
    let granted = Instant::now();
    let b = Registry::start(client.clone(), RegistryOptions::with_ttl(ttl))
        .await
        .unwrap();
    b.put("mm/nodes/b", "node b").await.unwrap();
    until(&mut view, |r| r.contains_key("mm/nodes/b")).await;
    let lease = b.lease_id();
    assert_eq!(lease_of(&client, "mm/nodes/b").await, Some(lease));
    drop(b);
    until(&mut view, |r| !r.contains_key("mm/nodes/b")).await;
    // Not before the lease could expire: it was granted (or last kept alive) no earlier than
    // `granted`, with the whole TTL to live. (A lower bound: a slow machine only makes it
    // later.)
    let gone = granted.elapsed();
    assert!(gone >= ttl, "gone {gone:?} after the lease was granted");
    // It went because the lease expired: etcd no longer knows the lease.
    let revoked = client.lease_revoke(lease).await;
    assert!(
        revoked.as_ref().is_err_and(|e| e.is_lease_not_found()),
        "{revoked:?}"
    );
    // Nothing else went with it.
    assert!(view.records().contains_key("mm/nodes/a"));

    // A clean stop takes its records at once: gone from etcd when `close` returns.
    a.close().await.unwrap();
    assert_eq!(lease_of(&client, "mm/nodes/a").await, None);
    until(&mut view, |r| r.is_empty()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_follows_changes_across_a_compaction_and_matches_a_fresh_read() {
    let (_etcd, client) = etcd().await;
    let writer = client.clone();
    writer.put("mm/k0", "v0", None).await.unwrap();
    let mut view = View::start(client.clone(), "mm/").await.unwrap();
    // Many changes, then everything before the last compacted away, while the view follows.
    for i in 1..50 {
        writer
            .put(format!("mm/k{i}"), format!("v{i}"), None)
            .await
            .unwrap();
    }
    let last = writer.put("mm/k0", "changed", None).await.unwrap();
    let revision = last.header.unwrap().revision;
    writer.compact(revision, true).await.unwrap();
    writer.delete("mm/k1").await.unwrap();
    until(&mut view, |r| {
        r.len() == 49 && r.get("mm/k0").is_some_and(|v| v == b"changed")
    })
    .await;
    // A view started after the compaction reads the same.
    let fresh = View::start(client.clone(), "mm/").await.unwrap();
    assert_eq!(*fresh.records(), *view.records());
}
