//! Who may use a server's admin API when no admin token is configured, and where secrets go
//! (security review T5-08, T5-14). On loopback the server makes a token and writes it to a file
//! only its account reads, so other local accounts are refused; its account's `modelmux
//! status` and `token` read the file, and send the token only to a server that proves it holds
//! it; `trust_local_users: true` restores the tokenless local admin API. A Python worker's
//! command line holds no `user_config`, and the inspection of an application never sees the
//! admin token.

use crate::common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::Running;

const APPLICATIONS: &str = "\
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Model
        num_replicas: 1
        model: {kind: synthetic, load_ms: 10, size_mb: 1}
";

/// `modelmux serve` of a synthetic model with `http_options: {port: 0<http>}`, keeping its
/// token files in `dir`: the server once it serves, and the lines it prints on stdout after
/// the "serving" line, as they come.
fn serve(http: &str, dir: &Path) -> (Running, Lines) {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("config.yaml");
    std::fs::write(
        &config,
        format!("http_options: {{port: 0{http}}}\n{APPLICATIONS}"),
    )
    .unwrap();
    let mut child = Command::new(common::BIN)
        .args(["serve", config.to_str().unwrap(), "--log-level", "warn"])
        .env("MODELMUX_RUNTIME_DIR", dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut serving = String::new();
    stdout.read_line(&mut serving).unwrap();
    let url = serving
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {serving:?}"))
        .to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let running = Running {
        child,
        url,
        logs: Default::default(),
        drain: None,
    };
    (running, rx)
}

/// The lines a server prints after its "serving" line (closed when it exits).
type Lines = std::sync::mpsc::Receiver<String>;

fn port(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// A call with `Content-Type: application/json` and, when given, the bearer `token`.
fn call(url: &str, method: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let body = if path == "/-/deploy" {
        br#"{"config": "applications: []"}"#.to_vec()
    } else {
        Vec::new()
    };
    common::send(url, request, body)
}

/// `modelmux <args>` with the token files in `dir`: exit status, stdout, stderr.
fn modelmux(args: &[&str], dir: &Path) -> (bool, String, String) {
    let out = Command::new(common::BIN)
        .args(args)
        .env("MODELMUX_RUNTIME_DIR", dir)
        .env_remove("MODELMUX_ADMIN_TOKEN")
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

const ADMIN_CALLS: [(&str, &str); 6] = [
    ("GET", "/-/models"),
    ("POST", "/-/models/Model/m1/load"),
    ("DELETE", "/-/models/Model/m1"),
    ("POST", "/-/deployments/Model/controls/pause"),
    ("POST", "/-/deploy"),
    ("GET", "/-/dashboard/state"),
];

#[test]
fn a_local_client_without_the_token_is_refused_and_the_servers_account_reads_it_from_its_file() {
    let root = tempfile::tempdir().unwrap();
    // A directory the server makes itself (its parents too).
    let dir = root.path().join("run/modelmux");
    let (mut server, lines) = serve("", &dir);
    let url = server.url.clone();
    let file = dir.join(format!("admin-{}.token", port(&url)));
    let said = lines.recv_timeout(std::time::Duration::from_secs(10));
    assert_eq!(
        said.as_deref().unwrap_or("nothing"),
        format!(
            "admin token in {} (modelmux status, deploy and token read it; \
             http_options.trust_local_users: true turns it off)",
            file.display()
        )
    );
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&file), 0o600);
    let token = std::fs::read_to_string(&file).unwrap().trim().to_owned();
    assert_eq!(token.len(), 64, "{token}");

    // Any other local account: JSON content type, a loopback Host, no token.
    for (method, path) in ADMIN_CALLS {
        let (status, body) = call(&url, method, path, None);
        assert_eq!(status, 401, "{method} {path}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["error"]["type"], "unauthorized", "{method} {path}");
    }
    let (status, body) = call(&url, "GET", "/-/models", Some(&token));
    assert_eq!(status, 200, "{body}");
    // Readiness and routes stay open; the handle-call door stays shut (no configured token).
    assert_eq!(call(&url, "GET", "/-/healthz", None).0, 200);
    let (status, _) = call(&url, "POST", "/-/deployments/Model/call/f", Some(&token));
    assert_eq!(status, 403);

    // The server proves it holds the token to a client that sends a nonce, without it.
    let nonce = "a-nonce-of-this-test-0123456789";
    let request = http::Request::get("/-/healthz").header("x-modelmux-nonce", nonce);
    let (_, headers, _) = common::send_with_headers(&url, request, Vec::new());
    assert_eq!(
        headers["x-modelmux-proof"].to_str().unwrap(),
        modelmux_serve::identity_proof(&token, nonce)
    );

    // The account's own commands read the file.
    let (ok, table, stderr) = modelmux(&["status", "--url", &url], &dir);
    assert!(ok && table.contains("Model#"), "{table}{stderr}");
    let (ok, printed, _) = modelmux(&["token", "--url", &url], &dir);
    assert!(ok);
    assert_eq!(printed.trim(), token);
    let (ok, printed, _) = modelmux(&["token", "--url", &url, "--path"], &dir);
    assert!(ok);
    assert_eq!(printed.trim(), file.to_str().unwrap());
    // --token still works, with a warning: every account sees it in `ps`.
    let elsewhere = root.path().join("empty");
    let (ok, table, stderr) = modelmux(&["status", "--url", &url, "--token", &token], &elsewhere);
    assert!(ok && table.contains("Model#"), "{table}{stderr}");
    assert!(
        stderr.contains("--token is visible to every account"),
        "{stderr}"
    );
    let token_file = root.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let flag = [
        "status",
        "--url",
        &url,
        "--token-file",
        token_file.to_str().unwrap(),
    ];
    let (ok, table, stderr) = modelmux(&flag, &elsewhere);
    assert!(ok && table.contains("Model#"), "{table}{stderr}");

    // The file goes with the server.
    let (exit, _) = server.terminate();
    assert!(exit.success());
    assert!(!file.exists());
    let (ok, _, stderr) = modelmux(&["token", "--url", &url], &dir);
    assert!(!ok && stderr.contains("no token file"), "{stderr}");
}

#[test]
fn trust_local_users_restores_the_tokenless_local_admin_api() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("modelmux");
    let (mut server, lines) = serve(", trust_local_users: true", &dir);
    for (method, path) in [
        ("GET", "/-/models"),
        ("POST", "/-/models/Model/m1/load"),
        ("DELETE", "/-/models/Model/m1"),
    ] {
        let (status, body) = call(&server.url, method, path, None);
        assert!(status < 300, "{method} {path}: {status} {body}");
    }
    // The content type still guards calls that change state.
    let request = http::Request::delete("/-/models/Model/m1");
    assert_eq!(common::send(&server.url, request, Vec::new()).0, 415);
    assert!(!dir.exists(), "no token file, nor its directory");
    let (ok, table, stderr) = modelmux(&["status", "--url", &server.url], &dir);
    assert!(ok && table.contains("Model#"), "{table}{stderr}");
    let (exit, _) = server.terminate();
    assert!(exit.success());
    // It printed no token line.
    let rest: Vec<String> = lines.iter().collect();
    assert!(!rest.iter().any(|l| l.contains("admin token")), "{rest:?}");
}

#[test]
fn status_sends_no_token_to_a_server_that_does_not_prove_it_holds_it() {
    // A process that took the port of this account's stopped server, whose token file stayed.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let stale = "a-token-of-a-server-that-stopped";
    let file = dir.path().join(format!("admin-{port}.token"));
    std::fs::write(&file, stale).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let seen = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for _ in 0..2 {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = stream.read(&mut buf).unwrap();
                assert!(n > 0);
                request.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"error": {"type": "unauthorized", "message": "who are you?"}}"#;
            let answer = format!(
                "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
                 x-modelmux-proof: {}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                "0".repeat(64),
                body.len()
            );
            stream.write_all(answer.as_bytes()).unwrap();
            seen.push(String::from_utf8_lossy(&request).into_owned());
        }
        seen
    });
    let url = format!("http://127.0.0.1:{port}");
    let (ok, _, stderr) = modelmux(&["status", "--url", &url], dir.path());
    assert!(!ok);
    assert!(
        stderr.contains("was not sent: the server did not prove that it holds it"),
        "{stderr}"
    );
    let seen = seen.join().unwrap().join("\n");
    assert!(!seen.contains(stale), "{seen}");
    assert!(
        !seen.to_ascii_lowercase().contains("authorization"),
        "{seen}"
    );
}

/// A Python application served by `modelmux serve` with `env` (`NAME=value`) added.
fn serve_python(import_path: &str, deployments: &str, env: &[String]) -> Running {
    let config = format!(
        "http_options: {{port: 0}}\napplications:\n  - name: default\n    route_prefix: /\n    \
         import_path: {import_path}\n    runtime_env: {{working_dir: {}}}\n{deployments}",
        common::python_apps_dir().display()
    );
    let mut wrapper = vec![
        "env".to_string(),
        format!("MODELMUX_PYTHON={}", common::test_python()),
        format!("PYTHONPATH={}", common::python_package_dir().display()),
    ];
    wrapper.extend(env.iter().cloned());
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    common::serve_in(&wrapper, &config, &[])
}

#[test]
fn a_python_workers_command_line_holds_no_user_config() {
    let secret = "a-user-config-secret-4242";
    let marker = format!("MODELMUX_TEST_MARK={}", std::process::id());
    let deployments = format!(
        "    deployments:\n      - name: Streamer\n        user_config: {{greeting: {secret}}}\n"
    );
    let server = serve_python("streaming:app", &deployments, std::slice::from_ref(&marker));
    let (status, body) = common::send(&server.url, http::Request::get("/greeting"), Vec::new());
    assert_eq!(
        (status, body.as_str()),
        (200, secret),
        "user_config reached reconfigure"
    );
    let workers: Vec<String> = common::processes_with(&marker)
        .into_iter()
        .filter(|c| c.contains("modelmux._worker"))
        .collect();
    assert!(!workers.is_empty(), "no worker found");
    for cmdline in workers {
        assert!(!cmdline.contains(secret), "{cmdline}");
        assert!(cmdline.contains("--spec -"), "{cmdline}");
    }
}

#[test]
fn the_inspection_of_a_python_application_never_sees_the_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let record: PathBuf = dir.path().join("seen");
    let token = "the-inspection-must-not-see-this";
    let env = [
        format!("MODELMUX_ADMIN_TOKEN={token}"),
        format!("MODELMUX_TEST_ENV_RECORD={}", record.display()),
    ];
    let server = serve_python("records_env:app", "", &env);
    let request = http::Request::get("/");
    assert_eq!(common::send(&server.url, request, Vec::new()).0, 200);
    let seen = std::fs::read_to_string(&record).unwrap();
    let roles: Vec<&str> = seen.lines().filter_map(|l| l.split(' ').nth(2)).collect();
    assert!(
        roles.contains(&"inspect") && roles.contains(&"worker"),
        "{seen}"
    );
    assert!(!seen.contains(token), "{seen}");
}
