//! Adapters a request names by their source (`model: "smollm2:s3://bucket/team-a/pirate"`,
//! LoRAX's per-request adapter source): served from below `lora_config.allowed_sources`, and
//! everywhere else refused with a 403 naming the rule before any byte is fetched. For S3 the
//! proof is the S3 server's own request log (`MODELMUX_TEST_S3_LOG`): it shows no request for
//! what was refused, and does show the requests for what was served.

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::*;
use modelmux_front::Server;
use serde_json::json;

/// A variable the test command sets; its absence fails the test.
fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!(
            "{name} is not set: these tests need an S3-compatible server and its access log. \
             Run ./scripts/test, or start `moto_server -p 5055 > /tmp/moto.log 2>&1` yourself \
             and export MODELMUX_TEST_S3_ENDPOINT=http://127.0.0.1:5055 \
             MODELMUX_TEST_S3_LOG=/tmp/moto.log"
        )
    })
}

const QUESTION: &str = "What is the capital of France?";

/// A server on a free port serving `config` on one LLM replica, downloading into `cache`, with
/// the adapter controls behind the admin token `secret`.
async fn serve_cached(config: &modelmux_openai::LlmConfig, cache: &Path) -> Server {
    let cache = modelmux_store::DiskCache::open(cache, 1 << 30).unwrap();
    let access = modelmux_serve::AdminAccess::with_token("secret");
    let both = modelmux_openai::llm_deployments("llm", config, "/", Some(&cache), &access).unwrap();
    Server::builder()
        .bind("127.0.0.1:0".parse().unwrap())
        .application(
            modelmux_serve::Application::new("llm")
                .ingress(both.ingress)
                .deployment(both.server),
        )
        .start()
        .await
        .unwrap()
}

/// The greedy answer to [`QUESTION`] with `model`, or the failed reply.
async fn answer(addr: SocketAddr, model: &str) -> Result<String, Reply> {
    let reply = post(
        addr,
        "/v1/chat/completions",
        chat(model, QUESTION, 12, false),
    )
    .await;
    if reply.status != 200 {
        return Err(reply);
    }
    Ok(reply.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned())
}

/// The greedy answer to [`QUESTION`] with `model`, which must be served.
async fn served(addr: SocketAddr, model: &str) -> String {
    answer(addr, model)
        .await
        .unwrap_or_else(|r| panic!("{model}: {}", String::from_utf8_lossy(&r.body)))
}

/// Asserts that `reply` is the 403 of the rule, in OpenAI's shape, naming `source`.
fn assert_refused(reply: &Reply, source: &str) {
    let body = String::from_utf8_lossy(&reply.body);
    assert_eq!(reply.status, 403, "{source}: {body}");
    let error = &reply.json()["error"];
    assert_eq!(error["type"], "forbidden", "{body}");
    assert_eq!(error["code"], 403, "{body}");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("is refused by lora_config.allowed_sources"),
        "{body}"
    );
    // Local paths are shortened in what clients see; URLs are not.
    let last = source.rsplit('/').next().unwrap();
    assert!(message.contains(last), "{body} should name {source}");
}

/// The refusal of `source` named by `model` in a chat request.
async fn assert_chat_refused(addr: SocketAddr, source: &str) {
    match answer(addr, &format!("smollm2:{source}")).await {
        Ok(text) => panic!("{source} was served: {text}"),
        Err(reply) => assert_refused(&reply, source),
    }
}

/// Asserts that the adapter cache loaded `loads` adapters and was never asked for a refused one
/// (a refusal comes before any replica's cache is).
async fn assert_nothing_else_loaded(addr: SocketAddr, loads: f64) {
    let metrics = metrics(addr).await;
    assert_eq!(
        metric(&metrics, "modelmux_model_loads_total"),
        loads,
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "modelmux_model_load_failures_total"),
        0.0,
        "{metrics}"
    );
}

fn copy_adapter(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(from.join(file), to.join(file)).unwrap();
    }
}

/// PUTs `body` at `path` of the S3 server (a bucket, or a key in one).
async fn s3_put(s3: SocketAddr, path: &str, body: Vec<u8>) {
    let reply = send(s3, "PUT", path, &[], body).await;
    assert_eq!(
        reply.status,
        200,
        "PUT {path}: {}",
        String::from_utf8_lossy(&reply.body)
    );
}

/// The S3 server's log lines past byte `from`.
fn log_since(log: &str, from: u64) -> Vec<String> {
    let text = std::fs::read(log).unwrap_or_else(|e| panic!("{log}: {e}"));
    String::from_utf8_lossy(&text[from as usize..])
        .lines()
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_sources_outside_allowed_sources_are_refused_and_never_reach_the_store() {
    let endpoint = env("MODELMUX_TEST_S3_ENDPOINT");
    let log = env("MODELMUX_TEST_S3_LOG");
    let s3: SocketAddr = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap_or_else(|e| panic!("MODELMUX_TEST_S3_ENDPOINT={endpoint}: {e}"));
    let run = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
    );
    let (allowed, forbidden) = (format!("src-ok-{run}"), format!("src-no-{run}"));
    let adapters = env_path("MODELMUX_TEST_ADAPTERS");
    s3_put(s3, &format!("/{allowed}"), Vec::new()).await;
    s3_put(s3, &format!("/{forbidden}"), Vec::new()).await;
    // The same adapter below the allowed prefix, below a prefix that only starts like it, and
    // in another bucket.
    for prefix in [
        format!("{allowed}/team-a"),
        format!("{allowed}/team-ab"),
        format!("{forbidden}/team-a"),
    ] {
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            let bytes = std::fs::read(adapters.join("pirate").join(file)).unwrap();
            s3_put(s3, &format!("/{prefix}/pirate/{file}"), bytes).await;
        }
    }
    let cache = tempfile::tempdir().unwrap();
    let config = config(json!({"lora_config": {
        "allowed_sources": [format!("s3://{allowed}/team-a")],
        "max_download_tries": 1,
        "options": {
            "endpoint": endpoint, "allow_http": true, "region": "us-east-1",
            "access_key_id": "test", "secret_access_key": "test",
        },
    }}));
    let server = serve_cached(&config, &cache.path().join("c")).await;
    let addr = server.local_addr();
    let start = std::fs::metadata(&log).unwrap().len();

    let refused = [
        format!("s3://{forbidden}/team-a/pirate"),
        format!("s3://{allowed}/team-ab/pirate"),
        format!("s3://{allowed}/team-a/../team-ab/pirate"),
        format!("s3://{allowed}/team-a/%2e%2e/team-ab/pirate"),
        format!("s3://{allowed}/team-a/pirate?versionId=1"),
        format!("s3a://{allowed}/team-a/pirate"),
    ];
    for source in &refused {
        assert_chat_refused(addr, source).await;
    }
    // Named by the header instead of `model`, the same.
    let reply = send(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("serve_multiplexed_model_id", refused[0].as_str())],
        serde_json::to_vec(&chat("smollm2", QUESTION, 4, false)).unwrap(),
    )
    .await;
    assert_refused(&reply, &refused[0]);
    // The admin's control loads only from where the configuration allows, too.
    let load = |source: &str| {
        let body = serde_json::to_vec(&json!({"lora_name": format!("smollm2:{source}")}));
        async move {
            let headers = [("authorization", "Bearer secret")];
            send(
                addr,
                "POST",
                "/v1/load_lora_adapter",
                &headers,
                body.unwrap(),
            )
            .await
        }
    };
    assert_refused(&load(&refused[0]).await, &refused[0]);

    // The allowed source serves the adapter itself: the answer is the repository's copy's.
    let source = format!("s3://{allowed}/team-a/pirate");
    let from_s3 = served(addr, &format!("smollm2:{source}")).await;
    assert_eq!(from_s3, served(addr, "smollm2:pirate").await);
    assert_ne!(
        from_s3,
        served(addr, "smollm2").await,
        "the adapter applies"
    );
    let loaded = load(&source).await;
    assert_eq!(
        loaded.status,
        200,
        "{}",
        String::from_utf8_lossy(&loaded.body)
    );
    let text = String::from_utf8_lossy(&loaded.body);
    assert!(text.contains("success") && text.contains(&source), "{text}");

    // The S3 server's log: the served adapter was read (so the log is live and complete up to
    // here), and nothing was asked about the refused ones since the uploads.
    let served = format!("GET /{allowed}/team-a/pirate/adapter_model.safetensors ");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let lines = log_since(&log, start);
        if lines.iter().any(|l| l.contains(&served)) {
            break lines;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the S3 log at {log} never showed '{served}':\n{}",
            lines.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let touched: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains(&format!("/{forbidden}")) || l.contains("/team-ab"))
        .collect();
    assert!(
        touched.is_empty(),
        "refused sources reached the store: {touched:#?}"
    );
    assert_nothing_else_loaded(addr, 2.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_sources_outside_allowed_sources_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().display().to_string();
    let pirate = env_path("MODELMUX_TEST_ADAPTERS").join("pirate");
    for place in ["allowed", "allowed-evil", "outside"] {
        copy_adapter(&pirate, &dir.path().join(place).join("pirate"));
    }
    let config = config(json!({"lora_config": {
        "allowed_sources": [format!("{root}/allowed/")],
    }}));
    let server = serve(&config, 1).await;
    let addr = server.local_addr();

    for source in [
        format!("{root}/outside/pirate"),
        format!("{root}/allowed-evil/pirate"),
        format!("{root}/allowed/../outside/pirate"),
        format!("file://{root}/allowed/../outside/pirate"),
        format!("{root}/allowed/./pirate"),
        format!("{root}/allowed//pirate"),
        format!("{root}/allowed"),
        format!("file://localhost{root}/allowed/pirate"),
    ] {
        assert_chat_refused(addr, &source).await;
    }

    let from_repository = served(addr, "smollm2:pirate").await;
    for source in [
        format!("{root}/allowed/pirate"),
        format!("file://{root}/allowed/pirate"),
    ] {
        let text = served(addr, &format!("smollm2:{source}")).await;
        assert_eq!(text, from_repository, "{source}");
    }
    // The repository's pirate and the two allowed sources.
    assert_nothing_else_loaded(addr, 3.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_allowed_sources_every_source_is_refused() {
    // The default: even the configured repository itself cannot be named as a source.
    let server = serve(&config(json!({})), 1).await;
    let addr = server.local_addr();
    let source = env_path("MODELMUX_TEST_ADAPTERS")
        .join("pirate")
        .display()
        .to_string();
    assert_chat_refused(addr, &source).await;
    let reply = post(
        addr,
        "/v1/chat/completions",
        chat(&format!("smollm2:{source}"), QUESTION, 4, false),
    )
    .await;
    let message = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(message.contains("the list is empty"), "{message}");
    assert_chat_refused(addr, "s3://adapters/team-a/pirate").await;
    // An adapter named by id is unaffected.
    served(addr, "smollm2:pirate").await;
}
