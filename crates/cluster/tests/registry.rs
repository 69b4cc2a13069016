//! The registry and the view against a real etcd (Debian's `etcd-server`, started on free
//! loopback ports by `LocalEtcd`): records appear in a view within milliseconds, go when deleted, go with the
//! lease when their process stops keeping it, come back on a new lease when etcd lets the old
//! one expire, and a view follows changes across a compaction. (A watch whose start revision
//! was compacted away is tested in `view.rs`.)

use std::time::Duration;

use modelmux_cluster::{LocalEtcd, Registry, RegistryOptions, View};
use modelmux_etcd::Client;
use tokio::time::Instant;

async fn etcd() -> (LocalEtcd, Client) {
    let etcd = LocalEtcd::start(1).await.expect("etcd must be installed");
    let client = modelmux_cluster::connect(&etcd.endpoints()).await.unwrap();
    (etcd, client)
}

/// Waits (at most `within`) until the view's records satisfy `ok`; returns how long it took.
async fn until(
    view: &mut View,
    within: Duration,
    ok: impl Fn(&modelmux_cluster::Records) -> bool,
) -> Duration {
    let start = Instant::now();
    while !ok(&view.records()) {
        let left = within.saturating_sub(start.elapsed());
        assert!(
            !left.is_zero(),
            "not within {within:?}: {:?}",
            view.records()
        );
        let _ = tokio::time::timeout(left, view.changed()).await;
    }
    start.elapsed()
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
    let took = until(&mut view, Duration::from_secs(2), |r| r.len() == 2).await;
    assert_eq!(view.records()["mm/nodes/a"], b"node a");
    assert!(took < Duration::from_millis(500), "seen after {took:?}");
    a.delete("mm/models/x/a").await.unwrap();
    until(&mut view, Duration::from_secs(2), |r| {
        !r.contains_key("mm/models/x/a")
    })
    .await;

    // Kept alive past its TTL.
    tokio::time::sleep(ttl * 2).await;
    assert!(
        view.records().contains_key("mm/nodes/a"),
        "the lease was kept alive"
    );

    // etcd lets the lease go (as after a long partition): the records come back on a new one.
    let old = a.lease_id();
    client.lease_revoke(old).await.unwrap();
    until(&mut view, Duration::from_secs(5), |r| {
        r.contains_key("mm/nodes/a") && r.len() == 1
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while a.lease_id() == old {
        assert!(Instant::now() < deadline, "no new lease");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until(&mut view, Duration::from_secs(5), |r| {
        r.contains_key("mm/nodes/a")
    })
    .await;

    // A process that stops keeping its lease (it died): its records go within the TTL.
    let b = Registry::start(client.clone(), RegistryOptions::with_ttl(ttl))
        .await
        .unwrap();
    b.put("mm/nodes/b", "node b").await.unwrap();
    until(&mut view, Duration::from_secs(2), |r| {
        r.contains_key("mm/nodes/b")
    })
    .await;
    drop(b);
    let gone = until(&mut view, ttl * 3, |r| !r.contains_key("mm/nodes/b")).await;
    assert!(gone <= ttl * 3, "{gone:?}");

    // A clean stop takes its records at once.
    a.close().await.unwrap();
    until(&mut view, Duration::from_secs(1), |r| r.is_empty()).await;
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
    until(&mut view, Duration::from_secs(5), |r| {
        r.len() == 49 && r.get("mm/k0").is_some_and(|v| v == b"changed")
    })
    .await;
    // A view started after the compaction reads the same.
    let fresh = View::start(client.clone(), "mm/").await.unwrap();
    assert_eq!(*fresh.records(), *view.records());
}
