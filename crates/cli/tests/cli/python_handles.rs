//! Python handle calls through the real server and real workers: arguments and results far
//! over one protocol frame (16 MiB), and `handle.options(stream=True)`, whose items reach the
//! caller while the callee's generator still runs, and whose generator is closed when the
//! client goes away. MODELMUX_TEST_PYTHON names the interpreter (`scripts/test` sets it).

use crate::common;

use std::time::Duration;

use http_body_util::BodyExt;

fn serve() -> common::Running {
    serve_with(&[])
}

/// [`serve`] with more environment variables (`NAME=value`) for the server.
fn serve_with(env: &[&str]) -> common::Running {
    let config = format!(
        "http_options: {{port: 0}}\napplications:\n  - name: default\n    route_prefix: /\n    import_path: streamed_calls:app\n    runtime_env: {{working_dir: {}}}\n",
        common::python_apps_dir().display()
    );
    let env_vars = [
        "env".to_string(),
        format!("MODELMUX_PYTHON={}", common::test_python()),
        format!("PYTHONPATH={}", common::python_package_dir().display()),
    ];
    let mut wrapper: Vec<&str> = env_vars.iter().map(String::as_str).collect();
    wrapper.extend(env);
    common::serve_in(&wrapper, &config, &[])
}

fn get(url: &str, path: &str) -> (u16, String) {
    common::send(url, http::Request::get(path), Vec::new())
}

#[test]
fn user_code_never_sees_the_admin_token() {
    let server = serve_with(&["MODELMUX_ADMIN_TOKEN=worker-must-not-see-this"]);
    let (status, body) = get(
        &server.url,
        "/sees-admin-token?value=worker-must-not-see-this",
    );
    assert_eq!(status, 200, "{body}");
    let seen: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        seen,
        serde_json::json!({"named": false, "anywhere": false}),
        "the worker sees the admin token"
    );
}

#[test]
fn arguments_and_results_of_40_mib_go_through_a_handle_call() {
    let server = serve();
    let (status, body) = get(&server.url, "/big?mib=40");
    assert_eq!(status, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let n = 40 << 20;
    assert_eq!(
        answer,
        serde_json::json!({"sent": n, "back": n, "same": true}),
        "{body}"
    );
}

/// A streaming GET of `path` whose client goes away (drops the connection) after `n` body
/// chunks; returns the chunks it read.
async fn read_then_leave(url: &str, path: &str, n: usize) -> Vec<String> {
    let (mut sender, host, conn) = common::connect(url).await;
    let request = http::Request::get(path)
        .header("host", host)
        .body(http_body_util::Full::default())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut chunks = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            chunks.push(String::from_utf8_lossy(&data).into_owned());
            if chunks.len() >= n {
                conn.abort();
                break;
            }
        }
    }
    chunks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generator_streams_through_a_handle_item_by_item_and_stops_when_the_client_goes() {
    let server = serve();
    let url = server.url.clone();
    // The first item reaches the client before the callee makes the second: the producer
    // makes it only once `/release` is asked for, which the client does when the first has
    // arrived (a handle that collected the items before passing them on would never get there).
    let (first, text) = common::stream_through_gate(&url, "/?n=5&gated=1", "/release").await;
    assert_eq!((first.as_str(), text.as_str()), ("0\n", "0\n1\n2\n3\n4\n"));
    let closed = |url: String| async move {
        tokio::task::spawn_blocking(move || get(&url, "/closed"))
            .await
            .unwrap()
    };
    assert_eq!(closed(url.clone()).await, (200, "1".to_string()));

    // A client that leaves after two items: the callee's generator is closed (its `finally`
    // runs) long before its 1000 items would have been made.
    let chunks = read_then_leave(&url, "/?n=1000", 2).await;
    assert_eq!(chunks.len(), 2);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, body) = closed(url.clone()).await;
        assert_eq!(status, 200, "{body}");
        if body == "2" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the producer's generator was not closed within 10 s of the client leaving ({body})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
