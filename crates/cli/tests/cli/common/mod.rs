//! Running the `modelmux` binary in tests: start it on a free port, talk HTTP to it, stop it.
#![allow(dead_code, unreachable_pub)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_modelmux");

pub struct Running {
    pub child: Child,
    pub url: String,
    /// Everything the server logged so far, drained continuously by a thread: a pipe nobody
    /// reads fills up and blocks the server's logging.
    pub logs: std::sync::Arc<parking_lot::Mutex<String>>,
    pub drain: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// Sends SIGTERM and returns at once.
    pub fn signal_term(&self) {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// Sends SIGTERM, waits (bounded) for the process to exit, and returns its exit status and
    /// everything it logged.
    pub fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        self.signal_term();
        let mut waited = Duration::ZERO;
        let exit = loop {
            if let Some(exit) = self.child.try_wait().unwrap() {
                break exit;
            }
            assert!(waited < Duration::from_secs(20), "did not stop");
            std::thread::sleep(Duration::from_millis(50));
            waited += Duration::from_millis(50);
        };
        if let Some(drain) = self.drain.take() {
            drain.join().unwrap();
        }
        let logs = self.logs.lock().clone();
        (exit, logs)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `modelmux serve` on a free port and waits for its "serving ... on" line.
pub fn serve(config: &str) -> Running {
    serve_with(config, &[])
}

pub fn serve_with(config: &str, extra: &[&str]) -> Running {
    serve_in(&[], config, extra)
}

/// `modelmux serve` run by `wrapper` (`ip netns exec NS`, say; empty: run directly).
pub fn serve_in(wrapper: &[&str], config: &str, extra: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config).unwrap();
    let running = start_in(
        wrapper,
        &[&["serve", path.to_str().unwrap()], extra].concat(),
    );
    std::mem::forget(dir); // the server read its config already; keep the file for its lifetime
    running
}

/// Starts `modelmux <args>` (a server) and waits for its "serving" line.
pub fn start(args: &[&str]) -> Running {
    start_in(&[], args)
}

/// Starts `modelmux <args>` run by `wrapper` (which must exec it, so the child is the server).
pub fn start_in(wrapper: &[&str], args: &[&str]) -> Running {
    let mut command = match wrapper.split_first() {
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(BIN);
            c
        }
        None => Command::new(BIN),
    };
    let mut child = command
        .args(args)
        .args(["--log-level", "info"])
        .env("MODELMUX_RUNTIME_DIR", runtime_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| {
            let mut stderr = String::new();
            let _ = std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr);
            panic!("no address in {line:?}; the server said: {stderr}")
        })
        .trim_end_matches('/')
        .to_string();
    let logs = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let sink = logs.clone();
    let drain = std::thread::spawn(move || {
        let mut line = String::new();
        while stderr.read_line(&mut line).is_ok_and(|n| n > 0) {
            sink.lock().push_str(&line);
            line.clear();
        }
    });
    Running {
        child,
        url,
        logs,
        drain: Some(drain),
    }
}

/// Where the servers the tests start keep the admin tokens they make (`MODELMUX_RUNTIME_DIR`):
/// a private directory of this test process's, not the account's own.
pub fn runtime_dir() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        tempfile::Builder::new()
            .prefix("modelmux-test-runtime-")
            .tempdir()
            .unwrap()
    })
    .path()
}

/// The admin token the server at `url` made for local users (its file in [`runtime_dir`]),
/// if it made one.
pub fn admin_token(url: &str) -> Option<String> {
    let port: u16 = url.trim_end_matches('/').rsplit(':').next()?.parse().ok()?;
    let path = runtime_dir().join(format!("admin-{port}.token"));
    let token = std::fs::read_to_string(path).ok()?;
    Some(token.trim().to_owned())
}

/// `request` with the bearer token the server at `url` made, if it made one (the admin API
/// of a server started without a token, as a local user who can read its file calls it).
pub fn as_local_admin(url: &str, request: http::request::Builder) -> http::request::Builder {
    match admin_token(url) {
        Some(token) => request.header("authorization", format!("Bearer {token}")),
        None => request,
    }
}

/// `curl -H 'serve_multiplexed_model_id: <model>' <url>/`.
pub fn curl(url: &str, model: &str) -> (u16, String) {
    post(url, model, "")
}

/// `curl -H 'serve_multiplexed_model_id: <model>' -d <body> <url>/` (a GET when `body` is
/// empty).
pub fn post(url: &str, model: &str, body: &str) -> (u16, String) {
    let method = if body.is_empty() { "GET" } else { "POST" };
    let request = hyper::Request::builder()
        .method(method)
        .uri("/")
        .header("serve_multiplexed_model_id", model);
    send(url, request, body.as_bytes().to_vec())
}

/// Sends `request` with `body` to the server at `url` on a fresh connection.
pub fn send(url: &str, request: http::request::Builder, body: Vec<u8>) -> (u16, String) {
    let (status, _, body) = send_with_headers(url, request, body);
    (status, body)
}

/// [`send`], with the response's headers too.
pub fn send_with_headers(
    url: &str,
    request: http::request::Builder,
    body: Vec<u8>,
) -> (u16, http::HeaderMap, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (status, headers, body) = rt.block_on(send_async(url, request, body));
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

/// A client connection, as [`connect`] opens it.
pub type Connection = hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>;

/// A fresh HTTP/1 connection to the server at `url`: its sender, the `Host` to give requests,
/// and the connection's task (abort it to hang up).
pub async fn connect(
    url: &str,
) -> (
    Connection,
    String,
    tokio::task::JoinHandle<Result<(), hyper::Error>>,
) {
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    (sender, addr.to_string(), tokio::spawn(conn))
}

/// Streams `GET path` and checks that its first chunk arrives before the rest are made: the
/// server makes them only once `GET release` is asked for (answered `released`), which this
/// does when the first chunk has arrived; a response held back until its end never gets there
/// (a failure after 30 s). Returns the first chunk and the whole body.
pub async fn stream_through_gate(url: &str, path: &str, release: &str) -> (String, String) {
    use http_body_util::BodyExt;
    let (mut sender, host, _conn) = connect(url).await;
    let request = http::Request::get(path)
        .header("host", host)
        .body(http_body_util::Full::default())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200, "GET {path}");
    let mut body = response.into_body();
    let mut text = String::new();
    let first = tokio::time::timeout(Duration::from_secs(30), async {
        while text.is_empty() {
            let frame = body.frame().await.expect("a first chunk").unwrap();
            if let Ok(data) = frame.into_data() {
                text.push_str(&String::from_utf8_lossy(&data));
            }
        }
    })
    .await;
    assert!(
        first.is_ok(),
        "GET {path}: nothing arrived before the rest was made"
    );
    let first = text.clone();
    let (status, _, released) = send_async(url, http::Request::get(release), Vec::new()).await;
    assert_eq!((status, released.as_slice()), (200, b"released".as_slice()));
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    (first, text)
}

/// [`send_with_headers`] from async code, the body as bytes.
pub async fn send_async(
    url: &str,
    request: http::request::Builder,
    body: Vec<u8>,
) -> (u16, http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt;
    let (mut sender, host, _conn) = connect(url).await;
    let request = request
        .header("host", host)
        .body(http_body_util::Full::new(bytes::Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, body.to_vec())
}

/// `PUT <endpoint><path>` with `body` (the test S3 server checks no signatures).
pub fn s3_put(endpoint: &str, path: &str, body: Vec<u8>) {
    let (status, answer) = send(endpoint, hyper::Request::put(path), body);
    assert!(
        (200..300).contains(&status),
        "PUT {path}: {status} {answer}"
    );
}

/// The Python that runs Python deployments' workers in tests: MODELMUX_TEST_PYTHON, which
/// `scripts/test` sets (the tests fail without it).
pub fn test_python() -> String {
    std::env::var("MODELMUX_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("MODELMUX_TEST_PYTHON must name a Python with numpy and starlette (scripts/test sets it)")
    })
}

/// The Python applications the tests serve (`tests/python_apps`).
pub fn python_apps_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python_apps")
}

/// The checkout's `modelmux` Python package (its parent directory, for PYTHONPATH).
pub fn python_package_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python")
}

/// The command lines of the processes whose environment has `variable` (`NAME=value`).
pub fn processes_with(variable: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|v| v == variable.as_bytes()) {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            found.push(String::from_utf8_lossy(&cmdline).replace('\0', " "));
        }
    }
    found
}
