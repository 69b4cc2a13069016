//! Fuzzing the admin API's parsing of paths, queries and bodies as clients send them: raw
//! request lines over a socket (so any byte can be in the path), methods, queries and bodies
//! drawn around the real endpoints. Every request gets a well-formed answer; an error is a
//! JSON body naming it, never a 500; and the server answers its health check throughout.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use modelmux_cache::Multiplexer;
use modelmux_front::Server;
use modelmux_serve::Application;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Counters, counted};

/// One server for every case (its runtime lives as long as the test binary).
fn server() -> (SocketAddr, &'static tokio::runtime::Runtime) {
    static SERVER: OnceLock<(SocketAddr, tokio::runtime::Runtime)> = OnceLock::new();
    let (addr, rt) = SERVER.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let addr = rt.block_on(async {
            let spec = counted(
                "Model",
                Arc::new(Counters::default()),
                Multiplexer::builder().max_models(2),
                Duration::ZERO,
                Duration::ZERO,
            );
            let server = Server::builder()
                .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
                .admin_token("t")
                .application(Application::new("a").ingress(spec))
                .start()
                .await
                .unwrap();
            let addr = server.local_addr();
            // Serves for the rest of the binary's life.
            std::mem::forget(server);
            addr
        });
        (addr, rt)
    });
    (*addr, rt)
}

/// Sends `head` and `body` on a new connection and reads the answer to its end: the status
/// and the body, or `None` when the server closed without one.
async fn exchange(addr: SocketAddr, head: Vec<u8>, body: &[u8]) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect(addr).await.ok()?;
    s.write_all(&head).await.ok()?;
    s.write_all(body).await.ok()?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer))
        .await
        .expect("no answer within 10 s")
        .ok()?;
    let text = String::from_utf8_lossy(&answer);
    let status = text.get(9..12)?.parse().ok()?;
    let body_at = text.find("\r\n\r\n")? + 4;
    Some((status, answer[body_at..].to_vec()))
}

fn segment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("models".to_string()),
        Just("deployments".to_string()),
        Just("Model".to_string()),
        Just("m".to_string()),
        Just("load".to_string()),
        Just("unpin".to_string()),
        Just("controls".to_string()),
        Just("reconfigure".to_string()),
        Just("sleep".to_string()),
        Just("call".to_string()),
        Just("__call__".to_string()),
        Just("..".to_string()),
        Just("%2e%2e".to_string()),
        Just("%00".to_string()),
        Just("%ff%fe".to_string()),
        Just(String::new()),
        Just("x".repeat(300)),
        "[a-zA-Z0-9_.:~-]{0,12}",
        "\\PC{0,6}",
    ]
}

fn request() -> impl Strategy<Value = (String, String, Option<String>, bool, bool, Vec<u8>)> {
    let method = prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("DELETE"),
        Just("PUT"),
        Just("PATCH")
    ];
    let path =
        proptest::collection::vec(segment(), 0..6).prop_map(|s| format!("/-/{}", s.join("/")));
    let query = proptest::option::of(prop_oneof![
        Just("pin=true".to_string()),
        Just("app=a".to_string()),
        Just("app=".to_string()),
        "[a-z=&%0-9]{0,20}",
    ]);
    let body = prop_oneof![
        Just(b"{}".to_vec()),
        Just(br#"{"user_config": {"a": 1}}"#.to_vec()),
        Just(b"[".repeat(200)),
        proptest::collection::vec(any::<u8>(), 0..64),
    ];
    (
        method.prop_map(String::from),
        path,
        query,
        any::<bool>(),
        any::<bool>(),
        body,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]
    #[test]
    fn every_admin_request_gets_a_well_formed_answer_and_never_a_500(
        (method, path, query, json, token, body) in request()
    ) {
        let (addr, rt) = server();
        let target = match &query {
            Some(q) => format!("{path}?{q}"),
            None => path.clone(),
        };
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
        if json {
            head.push_str("Content-Type: application/json\r\n");
        }
        if token {
            head.push_str("Authorization: Bearer t\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        let answer = rt.block_on(exchange(addr, head.into_bytes(), &body));
        // A request line the HTTP parser refuses is answered by it (or the connection closed);
        // what reaches the admin API is answered by it.
        if let Some((status, body)) = answer {
            prop_assert!(status != 500, "{method} {target}: 500 {}", String::from_utf8_lossy(&body));
            if status >= 400 && !body.is_empty() {
                let parsed: Result<serde_json::Value, _> = serde_json::from_slice(&body);
                prop_assert!(parsed.is_ok(), "{method} {target}: {status} not JSON: {}", String::from_utf8_lossy(&body));
            }
        }
        let health = rt.block_on(exchange(
            addr,
            b"GET /-/healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".to_vec(),
            b"",
        ));
        prop_assert_eq!(health.map(|(s, _)| s), Some(200));
    }
}
