//! `modelmux serve` with `kind: llm`: the official `openai` Python client against it, and
//! adapters from S3 through the disk cache.

use crate::common;

use common::*;
use modelmux_llm::{ChatMessage, LlmRuntime, RuntimeOptions, SamplingParams};
use modelmux_store::{ModelRepository, RepositoryOptions};

pub(crate) fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with ./scripts/test, which sets it up")
    })
}

pub(crate) fn llm_config(lora: &str, extra_lora: &str) -> String {
    format!(
        "\
http_options: {{port: 0}}
applications:
  - name: llm
    deployments:
      - name: LLMServer
        num_replicas: 1
        model:
          kind: llm
          model_loading_config: {{model_id: smollm2, model_source: '{gguf}'}}
          lora_config:
            dynamic_lora_loading_path: '{lora}'
{extra_lora}
          engine_kwargs: {{max_num_seqs: 8, max_model_len: 1024, kv_cache_bytes: 268435456}}
          experimental_configs: {{stream_batching_interval_ms: 20}}
",
        gguf = env("MODELMUX_TEST_GGUF"),
    )
}

/// The engine's own greedy answers, without HTTP.
fn direct(question: &str, adapters: &[Option<&str>], max_tokens: usize) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let repository =
            ModelRepository::open(&env("MODELMUX_TEST_ADAPTERS"), RepositoryOptions::default())
                .unwrap();
        let runtime = LlmRuntime::load(
            env("MODELMUX_TEST_GGUF"),
            Some(repository),
            RuntimeOptions::default(),
        )
        .await
        .unwrap();
        let prompt = runtime
            .chat_prompt(&[ChatMessage::new("user", question)])
            .unwrap();
        let mut answers = Vec::new();
        for adapter in adapters {
            let lease = match adapter {
                Some(a) => Some(runtime.adapter(a).await.unwrap()),
                None => None,
            };
            let text = runtime
                .generate(prompt.clone(), SamplingParams::greedy(max_tokens), lease)
                .unwrap()
                .collect()
                .await
                .unwrap()
                .text;
            answers.push(text);
        }
        answers
    })
}

/// Runs `script` (a file of this directory) with the test Python against `url`, with `args`;
/// its checks are `check(...)` calls, which `-O` keeps.
pub(crate) fn run_client(script: &str, url: &str, args: &[&str]) -> std::process::Output {
    let script = format!("{}/tests/{script}", env!("CARGO_MANIFEST_DIR"));
    let source = std::fs::read_to_string(&script).unwrap();
    let bare: Vec<&str> = source
        .lines()
        .filter(|l| l.trim_start().starts_with("assert "))
        .collect();
    assert!(bare.is_empty(), "use check(...), not assert: {bare:?}");
    std::process::Command::new(env("MODELMUX_TEST_PYTHON"))
        .arg(&script)
        .arg(url)
        .args(args)
        .env("PYTHONOPTIMIZE", "1")
        .output()
        .unwrap()
}

#[test]
fn structured_output_and_tool_calls_hold_for_the_official_client() {
    let mut server = serve(&llm_config(&env("MODELMUX_TEST_ADAPTERS"), ""));
    let out = run_client("structured_client.py", &server.url, &[]);
    let (_, logs) = server.terminate();
    assert!(
        out.status.success(),
        "the structured-output checks failed:\n{}\n{}\nserver logs:\n{logs}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two LLM replicas in one process (one copy of the weights, steps run as shared passes):
/// concurrent requests on the base model and an adapter, more than one replica takes at once
/// (`max_num_seqs: 2` each), so both serve, each get exactly the engine's own greedy answer.
#[test]
fn two_replicas_sharing_one_model_answer_as_the_engine_alone() {
    let question = "What is the capital of France?";
    let max_tokens = 12;
    let models = [None, Some("pirate")];
    let answers = direct(question, &models, max_tokens);
    let config = llm_config(&env("MODELMUX_TEST_ADAPTERS"), "")
        .replace("num_replicas: 1", "num_replicas: 2")
        .replace("max_num_seqs: 8", "max_num_seqs: 2");
    let mut server = serve(&config);
    let asks: Vec<_> = (0..8)
        .map(|i| {
            let (url, which) = (server.url.clone(), i % 2);
            let model = match models[which] {
                Some(adapter) => format!("smollm2:{adapter}"),
                None => "smollm2".to_owned(),
            };
            std::thread::spawn(move || {
                let body = serde_json::json!({
                    "model": model,
                    "messages": [{"role": "user", "content": question}],
                    "max_tokens": max_tokens,
                    "temperature": 0,
                });
                let request = hyper::Request::post("/v1/chat/completions")
                    .header("content-type", "application/json");
                (which, send(&url, request, body.to_string().into_bytes()))
            })
        })
        .collect();
    for ask in asks {
        let (which, (status, body)) = ask.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            v["choices"][0]["message"]["content"].as_str(),
            Some(answers[which].as_str()),
            "{:?}: {body}",
            models[which]
        );
    }
    server.terminate();
}

#[test]
fn the_official_openai_client_works_against_modelmux_serve() {
    let question = "What is the capital of France?";
    let max_tokens = 12;
    let answers = direct(question, &[None, Some("pirate")], max_tokens);
    let expected = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        expected.path(),
        serde_json::json!({
            "question": question,
            "max_tokens": max_tokens,
            "base": answers[0],
            "pirate": answers[1],
        })
        .to_string(),
    )
    .unwrap();
    let mut server = serve(&llm_config(&env("MODELMUX_TEST_ADAPTERS"), ""));
    // The script runs optimized (PYTHONOPTIMIZE=1), so its checks must be `check(...)` calls,
    // which always run, never `assert` statements, which -O skips.
    let out = run_client(
        "openai_client.py",
        &server.url,
        &[expected.path().to_str().unwrap()],
    );
    let (_, logs) = server.terminate();
    assert!(
        out.status.success(),
        "the openai client's checks failed:\n{}\n{}\nserver logs:\n{logs}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // One INFO line per request, the front's access line, naming the request, its method and
    // path, and the adapter the body asked for (the front learns it from the LLM deployment).
    let access: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("modelmux::access"))
        .collect();
    assert!(!access.is_empty(), "no access line: {logs}");
    assert!(
        access.iter().all(|l| l.contains("request_id=")
            && l.contains("method=\"")
            && l.contains("path=\"/")),
        "{logs}"
    );
    assert!(
        access.iter().any(
            |l| l.contains("method=\"POST\" path=\"/v1/chat/completions\"")
                && l.contains("model_id=\"pirate\"")
        ),
        "the adapter is on the outer line: {logs}"
    );
    assert!(!logs.contains("generation started"), "{logs}");
}

/// The official `openai` client's Responses API and the official `anthropic` client's
/// Messages API: every answer the chat of the same conversation (the scripts compare).
#[test]
fn the_official_responses_and_anthropic_clients_work_against_modelmux_serve() {
    let mut server = serve(&llm_config(&env("MODELMUX_TEST_ADAPTERS"), ""));
    let outs = ["responses_client.py", "anthropic_client.py"]
        .map(|script| (script, run_client(script, &server.url, &[])));
    let (_, logs) = server.terminate();
    for (script, out) in outs {
        assert!(
            out.status.success(),
            "{script}: the client's checks failed:\n{}\n{}\nserver logs:\n{logs}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The access line names the API's own path, though the LLM deployment ran a chat.
    for path in ["/v1/responses", "/v1/messages", "/v1/messages/count_tokens"] {
        assert!(
            logs.lines()
                .any(|l| l.contains("modelmux::access") && l.contains(&format!("path=\"{path}\""))),
            "no access line for {path}: {logs}"
        );
    }
}

fn metric(text: &str, name: &str) -> f64 {
    modelmux_promtext::parse(text).unwrap().sum(name)
}

fn chat(url: &str, model: &str) -> (u16, String) {
    let body = serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 3,
        "temperature": 0,
    });
    send(
        url,
        hyper::Request::post("/v1/chat/completions").header("content-type", "application/json"),
        body.to_string().into_bytes(),
    )
}

/// Overwrites an object with a signed request (moto refuses unsigned writes to a bucket once
/// signed clients have used it).
fn overwrite(endpoint: &str, bucket: &str, key: &str, bytes: &'static [u8]) {
    use modelmux_store::object_store::{
        ObjectStoreExt, PutPayload, aws::AmazonS3Builder, path::Path,
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let store = AmazonS3Builder::new()
        .with_endpoint(endpoint)
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .with_allow_http(true)
        .build()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(store.put(&Path::parse(key).unwrap(), PutPayload::from_static(bytes)))
        .unwrap();
}

#[test]
fn adapters_come_from_s3_through_the_disk_cache_and_are_evicted_past_the_cap() {
    let endpoint = env("MODELMUX_TEST_S3_ENDPOINT");
    let bucket = format!("llm-{}", std::process::id());
    s3_put(&endpoint, &format!("/{bucket}"), Vec::new());
    let adapters = std::path::PathBuf::from(env("MODELMUX_TEST_ADAPTERS"));
    for id in ["pirate", "tutor", "poet"] {
        for file in ["adapter_config.json", "adapter_model.safetensors"] {
            let bytes = std::fs::read(adapters.join(id).join(file)).unwrap();
            s3_put(&endpoint, &format!("/{bucket}/adapters/{id}/{file}"), bytes);
        }
    }
    let cache = tempfile::tempdir().unwrap();
    let extra = format!(
        "            max_num_adapters_per_replica: 2
            download_timeout_s: 30
            max_download_tries: 2
            options: {{endpoint: '{endpoint}', allow_http: true, region: us-east-1, access_key_id: test, secret_access_key: test}}"
    );
    let config = llm_config(&format!("s3://{bucket}/adapters"), &extra).replace(
        "applications:",
        &format!(
            "disk_cache: {{path: '{}'}}\napplications:",
            cache.path().join("c").display()
        ),
    );
    let mut server = serve(&config);
    for model in ["smollm2:pirate", "smollm2:tutor", "smollm2:poet"] {
        let (status, body) = chat(&server.url, model);
        assert_eq!(status, 200, "{model}: {body}");
    }
    // pirate was evicted (two adapters per replica). Its files in S3 are now garbage: it
    // still comes back, from the disk cache (downloaded once).
    overwrite(
        &endpoint,
        &bucket,
        "adapters/pirate/adapter_config.json",
        b"garbage",
    );
    overwrite(
        &endpoint,
        &bucket,
        "adapters/pirate/adapter_model.safetensors",
        b"garbage",
    );
    let (status, body) = chat(&server.url, "smollm2:pirate");
    assert_eq!(status, 200, "{body}");
    let (_, metrics) = send(&server.url, hyper::Request::get("/metrics"), Vec::new());
    assert_eq!(
        metric(&metrics, "modelmux_model_loads_total"),
        4.0,
        "{metrics}"
    );
    assert!(
        metric(&metrics, "modelmux_model_evictions_total") >= 2.0,
        "{metrics}"
    );
    assert_eq!(metric(&metrics, "modelmux_models_loaded"), 2.0, "{metrics}");
    // An adapter that is not in the bucket: 404 naming the repository.
    let (status, body) = chat(&server.url, "smollm2:nobody");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains(&format!("s3://{bucket}/adapters")), "{body}");
    server.terminate();
}

#[test]
fn a_failing_adapter_store_is_a_502_and_the_base_model_still_answers() {
    // Nothing listens on port 9 of loopback: every S3 request fails to connect.
    let cache = tempfile::tempdir().unwrap();
    let extra = "            max_download_tries: 1
            download_timeout_s: 5
            options: {endpoint: 'http://127.0.0.1:9', allow_http: true, region: us-east-1, access_key_id: test, secret_access_key: test}";
    let config = llm_config("s3://bucket/adapters", extra).replace(
        "applications:",
        &format!(
            "disk_cache: {{path: '{}'}}\napplications:",
            cache.path().join("c").display()
        ),
    );
    let mut server = serve(&config);
    let (status, body) = chat(&server.url, "smollm2:pirate");
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("pirate"), "{body}");
    let (status, body) = chat(&server.url, "smollm2");
    assert_eq!(status, 200, "{body}");
    server.terminate();
}

/// `serve --check` refuses what could only fail later: a KV budget that holds no sequence of
/// `max_model_len` (every long request would get a 400 blaming the client), and a file that
/// is not a GGUF model (an ONNX file, here).
#[test]
fn check_refuses_a_kv_budget_below_one_sequence_and_a_file_that_is_not_gguf() {
    let check = |config: &str| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("llm.yaml");
        std::fs::write(&path, config).unwrap();
        let out = std::process::Command::new(BIN)
            .args(["serve", "--check", path.to_str().unwrap()])
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let good = llm_config(&env("MODELMUX_TEST_ADAPTERS"), "");
    let (ok, err) = check(&good);
    assert!(ok, "{err}");

    let (ok, err) = check(&good.replace("kv_cache_bytes: 268435456", "kv_cache_bytes: 1000"));
    assert!(!ok);
    assert!(
        err.contains("kv_cache_bytes")
            && err.contains("max_model_len (1024 tokens)")
            && err.contains("bytes per token"),
        "{err}"
    );

    let onnx = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/models/customer-1/model.onnx"
    );
    let (ok, err) = check(&good.replace(&env("MODELMUX_TEST_GGUF"), onnx));
    assert!(!ok);
    assert!(
        err.contains("model_source") && err.contains("not a readable GGUF file"),
        "{err}"
    );
}

/// The README's prompt for the demo adapters (not in their training prompts).
const README_PROMPT: &str = "What should I pack for a day at the beach?";

/// The sentences of an answer: runs of text ending in `.`, `!` or `?` (a cut-off tail counts).
fn sentence_count(text: &str) -> usize {
    text.split_inclusive(['.', '!', '?'])
        .filter(|s| s.chars().any(char::is_alphabetic))
        .count()
}

/// The shipped demo adapters (`examples/adapters`, trained by
/// `scripts/llm/train-demo-adapters`) do what their names say, through the server as the
/// README shows it: greedy answers to the README's prompt that differ from each other, `pirate`
/// in pirate speech, `brief` in one sentence where the base model writes several. Random
/// adapters (what the demo had before) fail every style check.
#[test]
fn the_demo_adapters_answer_the_readme_prompt_in_their_styles() {
    let adapters = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/adapters");
    let mut server = serve(&llm_config(adapters, ""));
    let answer = |model: &str| {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": README_PROMPT}],
            "max_tokens": 96,
            "temperature": 0,
        });
        let (status, text) = send(
            &server.url,
            hyper::Request::post("/v1/chat/completions").header("content-type", "application/json"),
            body.to_string().into_bytes(),
        );
        assert_eq!(status, 200, "{model}: {text}");
        let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
        reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let base = answer("smollm2");
    let pirate = answer("smollm2:pirate");
    let brief = answer("smollm2:brief");
    server.terminate();
    let all = format!("base: {base}\npirate: {pirate}\nbrief: {brief}");
    assert!(base != pirate && base != brief && pirate != brief, "{all}");
    let pirate_words = ["Arr", "Ahoy", "matey", "Yo ho ho", "Shiver me timbers"];
    assert!(
        pirate_words.iter().any(|w| pirate.contains(w))
            && !pirate_words.iter().any(|w| base.contains(w)),
        "{all}"
    );
    assert!(
        sentence_count(&brief) == 1 && sentence_count(&base) >= 3 && brief.len() * 3 < base.len(),
        "{all}"
    );
}
