//! modelmux-etcd and the cluster's registry and view against a real etcd run as a cluster's
//! etcd should be (`LocalEtcd::start_secure`: Debian's `etcd-server` with `--cert-file`,
//! `--key-file`, `--trusted-ca-file`, `--client-cert-auth` and `auth enable`): KV, watch and
//! leases work over TLS as the `modelmux` user, whose role reaches `modelmux/` only; a client
//! without the client certificate, one with a wrong password and one with no user at all are
//! refused, each with an error that says so; an expired token is renewed. These tests fail,
//! never skip, without etcd.

use std::time::Duration;

use modelmux_cluster::local_etcd_tls::{SecureEtcd, SecureOptions, USER};
use modelmux_cluster::{EtcdSecurity, LocalEtcd, Registry, RegistryOptions, View};
use modelmux_etcd::{Client, ConnectOptions, Credentials, EventType, TlsOptions, WatchOptions};
use tokio::time::Instant;

/// How long a test waits for what it expects: far longer than any step (milliseconds).
const WAIT: Duration = Duration::from_secs(20);

async fn secure_etcd() -> (LocalEtcd, SecureEtcd) {
    let etcd = LocalEtcd::start_secure(1)
        .await
        .expect("etcd must be installed (Debian's etcd-server)");
    let secure = etcd.secure().unwrap().clone();
    (etcd, secure)
}

/// A short deadline, so that a refused client fails at once rather than after retries.
fn quick(options: ConnectOptions) -> ConnectOptions {
    options
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_watch_and_leases_work_over_tls_as_an_authenticated_user() {
    let (etcd, secure) = secure_etcd().await;
    let client = Client::connect(etcd.endpoints(), secure.connect_options())
        .await
        .unwrap();
    assert!(etcd.endpoints()[0].starts_with("https://"));

    // Keys: written and read back.
    client.put("modelmux/t/a", "1", None).await.unwrap();
    let reply = client.get("modelmux/t/a").await.unwrap();
    assert_eq!(reply.kvs[0].value, b"1");

    // A watch sees the next change.
    let options = WatchOptions::new().with_prefix();
    let (_watcher, mut events) = client.watch("modelmux/t/", options).await.unwrap();
    client.put("modelmux/t/b", "2", None).await.unwrap();
    let reply = tokio::time::timeout(WAIT, events.message())
        .await
        .expect("an event")
        .unwrap()
        .unwrap();
    let event = &reply.events[0];
    assert_eq!(event.r#type(), EventType::Put);
    assert_eq!(event.kv.as_ref().unwrap().key, b"modelmux/t/b");

    // A lease: granted, kept alive, a key on it, revoked (and the key goes with it).
    let lease = client.lease_grant(5).await.unwrap().id;
    let (keeper, mut replies) = client.lease_keep_alive(lease).await.unwrap();
    keeper.keep_alive().await.unwrap();
    let renewed = replies.message().await.unwrap().unwrap();
    assert!(renewed.ttl > 0, "{renewed:?}");
    client
        .put("modelmux/t/leased", "x", Some(lease))
        .await
        .unwrap();
    client.lease_revoke(lease).await.unwrap();
    assert!(
        client
            .get("modelmux/t/leased")
            .await
            .unwrap()
            .kvs
            .is_empty()
    );

    // The user's role reaches modelmux/ only: auth is on, and enforced.
    let outside = client.put("elsewhere", "x", None).await.unwrap_err();
    assert!(
        outside.to_string().contains("permission denied"),
        "{outside}"
    );

    // The cluster's own machinery, connected as a node is: a record on a lease, in a view.
    let security = EtcdSecurity {
        tls: Some(secure.tls()),
        credentials: Some(secure.credentials()),
    };
    let node = modelmux_cluster::connect_with(&etcd.endpoints(), &security)
        .await
        .unwrap();
    let mut view = View::start(node.clone(), "modelmux/t/nodes/")
        .await
        .unwrap();
    let registry = Registry::start(node, RegistryOptions::with_ttl(Duration::from_secs(2)))
        .await
        .unwrap();
    registry.put("modelmux/t/nodes/n1", "up").await.unwrap();
    let start = Instant::now();
    while !view.records().contains_key("modelmux/t/nodes/n1") {
        assert!(
            start.elapsed() < WAIT,
            "not in the view: {:?}",
            view.records()
        );
        let _ = tokio::time::timeout(WAIT, view.changed()).await;
    }
    // Kept alive past its TTL, then gone at once on close.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(client.get("modelmux/t/nodes/n1").await.unwrap().kvs.len() == 1);
    registry.close().await.unwrap();
    assert!(
        client
            .get("modelmux/t/nodes/n1")
            .await
            .unwrap()
            .kvs
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_client_certificate_is_refused() {
    let (etcd, secure) = secure_etcd().await;
    // The right CA and the right user, but no client certificate: the connection is refused
    // (etcd's TLS alert says so, or, when the reset beats it, the client says what a closed
    // connection means for a client without a certificate).
    let tls = TlsOptions::from_ca_file(&secure.ca_file).unwrap();
    let options = quick(ConnectOptions::new())
        .with_tls(tls)
        .with_credentials(secure.credentials());
    let client = Client::connect(etcd.endpoints(), options).await.unwrap();
    let refused = client.get("modelmux/t/a").await.unwrap_err();
    let message = refused.to_string();
    eprintln!("without the client certificate: {message}");
    assert!(
        message.contains("client certificate"),
        "the error should say the certificate was refused: {message}"
    );
    assert!(!refused.is_authentication_failed(), "{refused:?}");

    // Plaintext to a TLS member gets nowhere either.
    let plain = etcd.endpoints()[0].replace("https://", "http://");
    let client = Client::connect([plain], quick(ConnectOptions::new()))
        .await
        .unwrap();
    assert!(client.get("modelmux/t/a").await.is_err());

    // A CA that did not sign the members' certificate: this client refuses them.
    let other = LocalEtcd::start_secure(1).await.unwrap();
    let foreign_ca = TlsOptions::from_ca_file(&other.secure().unwrap().ca_file)
        .unwrap()
        .with_identity_files(&secure.cert_file, &secure.key_file)
        .unwrap();
    let options = quick(ConnectOptions::new()).with_tls(foreign_ca);
    let client = Client::connect(etcd.endpoints(), options).await.unwrap();
    let untrusted = client.get("modelmux/t/a").await.unwrap_err().to_string();
    eprintln!("an untrusted CA: {untrusted}");
    assert!(
        untrusted.contains("does not trust etcd's certificate"),
        "{untrusted}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_no_user_is_refused() {
    let (etcd, secure) = secure_etcd().await;
    let wrong = quick(ConnectOptions::new())
        .with_tls(secure.tls())
        .with_credentials(Credentials::new(USER, "not-the-password"));
    let client = Client::connect(etcd.endpoints(), wrong).await.unwrap();
    let refused = client.get("modelmux/t/a").await.unwrap_err();
    assert!(refused.is_authentication_failed(), "{refused:?}");
    let message = refused.to_string();
    eprintln!("a wrong password: {message}");
    assert!(
        message.contains("modelmux") && message.contains("authentication failed"),
        "{message}"
    );
    assert!(!message.contains("not-the-password"), "{message}");
    // Every call is refused so, a watch and a lease too.
    assert!(
        client
            .lease_grant(5)
            .await
            .unwrap_err()
            .is_authentication_failed()
    );
    let watch = client.watch("modelmux/t/", WatchOptions::new()).await;
    assert!(watch.unwrap_err().is_authentication_failed());

    // The client certificate alone authenticates no one: its name is no user's.
    let anonymous = quick(ConnectOptions::new()).with_tls(secure.tls());
    let client = Client::connect(etcd.endpoints(), anonymous).await.unwrap();
    let denied = client.put("modelmux/t/a", "x", None).await.unwrap_err();
    assert!(denied.to_string().contains("permission denied"), "{denied}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_renewed_for_every_kind_of_call() {
    // Tokens that live 1 s unused.
    let options = SecureOptions {
        token_ttl: Some(Duration::from_secs(1)),
    };
    let etcd = LocalEtcd::start_secure_with(1, options).await.unwrap();
    let secure = etcd.secure().unwrap();
    let client = Client::connect(etcd.endpoints(), secure.connect_options())
        .await
        .unwrap();
    client.put("modelmux/t/a", "1", None).await.unwrap();
    // Each call below comes after its token expired: etcd refuses it ("invalid auth token",
    // or for a watch "permission denied"), and the client asks for a new one and calls again.
    let idle = Duration::from_secs(3);
    tokio::time::sleep(idle).await;
    assert_eq!(client.get("modelmux/t/a").await.unwrap().kvs[0].value, b"1");
    tokio::time::sleep(idle).await;
    let (_watcher, _events) = client
        .watch("modelmux/t/", WatchOptions::new().with_prefix())
        .await
        .unwrap();
    tokio::time::sleep(idle).await;
    let lease = client.lease_grant(5).await.unwrap().id;
    tokio::time::sleep(idle).await;
    client.lease_revoke(lease).await.unwrap();
}
