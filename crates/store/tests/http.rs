//! A repository on a plain web server (Python's `http.server`, a real, independent
//! implementation): models are downloaded through the disk cache once and read from there.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use modelmux_cache::ModelId;
use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions};

struct WebServer {
    child: Child,
    url: String,
}

impl Drop for WebServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn web_server(dir: &std::path::Path) -> WebServer {
    let mut child = Command::new("python3")
        .args([
            "-u",
            "-m",
            "http.server",
            "0",
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("python3 (on every machine of this kind) serves the test repository");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    let port = line
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    WebServer {
        child,
        url: format!("http://127.0.0.1:{port}/models"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_on_a_web_server_are_downloaded_once_into_the_disk_cache() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join("models/m")).unwrap();
    let bytes: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(root.path().join("models/m/model.onnx"), &bytes).unwrap();
    let server = web_server(root.path());
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(cache_dir.path().join("c"), 1 << 20).unwrap();
    let repository = ModelRepository::open(
        &server.url,
        RepositoryOptions {
            disk_cache: Some(cache.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let id = ModelId::new("m").unwrap();
    assert_eq!(repository.size(&id, "model.onnx").await.unwrap(), 200_000);
    let fetches = (0..8).map(|_| {
        let repository = repository.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let file = repository.fetch(&id, "model.onnx").await.unwrap();
            file.bytes().await.unwrap()
        })
    });
    for got in futures_util::future::join_all(fetches).await {
        assert!(got.unwrap() == bytes);
    }
    assert_eq!(cache.stats().downloads, 1);
    let missing = repository
        .fetch(&ModelId::new("nope").unwrap(), "model.onnx")
        .await
        .err()
        .unwrap();
    assert!(missing.is_not_found(), "{missing}");
    assert!(
        missing
            .to_string()
            .contains(&format!("not found in {}", server.url)),
        "{missing}"
    );
    // A trailing slash and credentials in the URL: the same files, and the credentials never
    // appear in messages.
    let with_secret = server.url.replace("http://", "http://user:s3cret@") + "/";
    let repository = ModelRepository::open(
        &with_secret,
        RepositoryOptions {
            disk_cache: Some(cache.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(repository.size(&id, "model.onnx").await.unwrap(), 200_000);
    let missing = repository
        .fetch(&ModelId::new("nope").unwrap(), "model.onnx")
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        !missing.contains("s3cret") && missing.contains("not found in http://127.0.0.1"),
        "{missing}"
    );
    let query = ModelRepository::open(
        &format!("{}?token=abc", server.url),
        RepositoryOptions {
            disk_cache: Some(cache.clone()),
            ..Default::default()
        },
    )
    .err()
    .unwrap()
    .to_string();
    assert!(
        query.contains("cannot have a query") && !query.contains("abc"),
        "{query}"
    );
}
