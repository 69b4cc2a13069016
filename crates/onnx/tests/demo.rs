//! The ONNX kind against the demo repository: tract's outputs match what numpy computed when
//! the models were generated (`examples/models/*/reference.json`), and bad requests are refused
//! with messages that say what is wrong.

use std::path::PathBuf;

use modelmux_cache::ModelId;
use modelmux_onnx::{Onnx, OnnxModel};
use modelmux_serve::ModelKind;
use modelmux_store::{ModelRepository, RepositoryOptions};
use serde_json::Value;

fn demo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/models")
}

fn demo_ids() -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(demo_dir())
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            e.path()
                .join("model.onnx")
                .exists()
                .then(|| e.file_name().into_string().unwrap())
        })
        .collect();
    ids.sort();
    ids
}

fn kind() -> Onnx {
    Onnx::new(
        ModelRepository::open(demo_dir().to_str().unwrap(), RepositoryOptions::default()).unwrap(),
    )
}

fn run(model: &OnnxModel, id: &str, body: &str) -> Result<Value, String> {
    let inputs = model.signature().parse_request(body.as_bytes())?;
    let outputs = model.run(inputs).map_err(|e| e.to_string())?;
    let text = model.signature().render_response(id, &outputs)?;
    Ok(serde_json::from_str(&text).unwrap())
}

fn flat(v: &Value, out: &mut Vec<f64>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flat(i, out)),
        Value::Number(n) => out.push(n.as_f64().unwrap()),
        other => panic!("not a number: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_demo_model_matches_numpy() {
    let ids = demo_ids();
    assert!(
        ids.len() >= 8,
        "the demo repository has {} models",
        ids.len()
    );
    let kind = kind();
    let mut answers = Vec::new();
    for id in &ids {
        let model = kind.load(&ModelId::new(id).unwrap()).await.unwrap();
        let reference: Value = serde_json::from_str(
            &std::fs::read_to_string(demo_dir().join(id).join("reference.json")).unwrap(),
        )
        .unwrap();
        let request = serde_json::json!({"inputs": reference["inputs"]}).to_string();
        let got = run(&model, id, &request).unwrap();
        assert_eq!(got["model_id"], id.as_str());
        let (mut want, mut have) = (Vec::new(), Vec::new());
        flat(&reference["outputs"]["probabilities"], &mut want);
        flat(&got["outputs"]["probabilities"], &mut have);
        assert_eq!(want.len(), have.len(), "{id}");
        assert!(!want.is_empty());
        for (w, h) in want.iter().zip(&have) {
            assert!(
                (w - h).abs() <= 1e-5 + 1e-4 * w.abs(),
                "{id}: numpy {w}, tract {h}"
            );
        }
        // The unnamed form gives the same answer.
        let unnamed = serde_json::json!({"inputs": reference["inputs"]["features"]}).to_string();
        assert_eq!(
            run(&model, id, &unnamed).unwrap()["outputs"],
            got["outputs"]
        );
        answers.push(got["outputs"].to_string());
    }
    answers.sort();
    answers.dedup();
    assert_eq!(answers.len(), ids.len(), "every model has its own weights");
}

#[tokio::test]
async fn bad_requests_name_the_input_and_what_it_expects() {
    let model = kind()
        .load(&ModelId::new("customer-1").unwrap())
        .await
        .unwrap();
    let cases = [
        ("", "no body"),
        ("{", "not valid JSON"),
        ("42", "not a JSON object"),
        (r#"{"input": [[1,2,3,4]]}"#, "no \"inputs\""),
        (r#"{"inputs": [[1,2,3,4]], "x": 1}"#, "unknown field \"x\""),
        (
            r#"{"inputs": {}}"#,
            "missing input 'features': float32 [N, 4]",
        ),
        (
            r#"{"inputs": {"features": [[1,2,3,4]], "bias": [1]}}"#,
            "unknown input 'bias'",
        ),
        (
            r#"{"inputs": [[1,2,3]]}"#,
            "input 'features' expects shape [N, 4] (float32), got [1, 3]",
        ),
        (
            r#"{"inputs": [1,2,3,4]}"#,
            "input 'features' expects shape [N, 4] (float32), got [4]",
        ),
        (
            r#"{"inputs": [[1,2,3,4],[1,2]]}"#,
            "not a rectangular array",
        ),
        (r#"{"inputs": [[1,2,3,4],5]}"#, "not a rectangular array"),
        (
            r#"{"inputs": [[1,2,"three",4]]}"#,
            "input 'features' expects float32 values; \"three\" at [0, 2] is not one",
        ),
        (r#"{"inputs": []}"#, "got [0]"),
        (r#"{"inputs": 3}"#, "must be an object or an array"),
    ];
    for (body, expected) in cases {
        let err = run(&model, "customer-1", body).unwrap_err();
        assert!(err.contains(expected), "{body:?}: {err}");
    }
    // A batch of any size is fine.
    let ok = run(
        &model,
        "customer-1",
        r#"[[1,2,3,4],[0,0,0,0],[-1,0.5,2,3]]"#,
    )
    .unwrap();
    assert_eq!(ok["outputs"]["probabilities"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn a_file_that_is_not_onnx_is_a_clear_load_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("junk")).unwrap();
    std::fs::write(
        dir.path().join("junk/model.onnx"),
        b"definitely not protobuf",
    )
    .unwrap();
    let kind = Onnx::new(
        ModelRepository::open(dir.path().to_str().unwrap(), RepositoryOptions::default()).unwrap(),
    );
    let err = kind
        .load(&ModelId::new("junk").unwrap())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("not a valid ONNX model"), "{err}");
    let missing = kind
        .load(&ModelId::new("nope").unwrap())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(missing.contains("model 'nope' not found in"), "{missing}");
    let escape = kind
        .load(&ModelId::new("../etc").unwrap())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(escape.contains("cannot be used"), "{escape}");
}

#[tokio::test]
async fn hostile_requests_are_400s_not_crashes() {
    let model = kind()
        .load(&ModelId::new("customer-1").unwrap())
        .await
        .unwrap();
    // Claims a 16^11 shape through its first elements, in ~400 bytes: must not allocate it.
    let mut nested = "0".to_string();
    for _ in 0..11 {
        nested = format!("[{nested}{}]", ",0".repeat(15));
    }
    let err = run(&model, "customer-1", &format!(r#"{{"inputs": {nested}}}"#)).unwrap_err();
    assert!(err.contains("expects shape [N, 4]"), "{err}");
    let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
    assert!(run(&model, "customer-1", &format!(r#"{{"inputs": {deep}}}"#)).is_err());
    let err = run(&model, "customer-1", r#"{"inputs": [[1e39, 0, 0, 0]]}"#).unwrap_err();
    assert!(err.contains("1e39") || err.contains("1e+39"), "{err}");
    // A big valid batch is fine.
    let rows = vec!["[0.5,1,2,3]"; 5000].join(",");
    let ok = run(&model, "customer-1", &format!("[{rows}]")).unwrap();
    assert_eq!(
        ok["outputs"]["probabilities"].as_array().unwrap().len(),
        5000
    );
}

#[tokio::test]
async fn a_remote_file_that_is_not_onnx_leaves_nothing_in_the_disk_cache() {
    use modelmux_store::object_store::memory::InMemory;
    use modelmux_store::object_store::path::Path;
    use modelmux_store::object_store::{ObjectStoreExt, PutPayload};
    use modelmux_store::{DiskCache, RetryPolicy};

    let dir = tempfile::tempdir().unwrap();
    let cache = DiskCache::open(dir.path().join("c"), 1 << 20).unwrap();
    let store = std::sync::Arc::new(InMemory::new());
    let key = Path::parse("m/model.onnx").unwrap();
    store
        .put(&key, PutPayload::from_static(b"not a model at all"))
        .await
        .unwrap();
    let repository = ModelRepository::from_store(
        "mem://models",
        store.clone(),
        "",
        Some(cache.clone()),
        RetryPolicy::default(),
    )
    .unwrap();
    let kind = Onnx::new(repository);
    let err = kind.load(&ModelId::new("m").unwrap()).await.err().unwrap();
    assert!(err.to_string().contains("not a valid ONNX model"), "{err}");
    assert_eq!(cache.stats().downloads, 1);
    for _ in 0..100 {
        if cache.stats().files == 0
            && std::fs::read_dir(dir.path().join("c/files"))
                .unwrap()
                .next()
                .is_none()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(cache.stats().files, 0, "the bad copy is not kept");
    assert!(
        std::fs::read_dir(dir.path().join("c/files"))
            .unwrap()
            .next()
            .is_none()
    );
    // A fixed upload is picked up by the next load.
    let good = std::fs::read(demo_dir().join("customer-1/model.onnx")).unwrap();
    store.put(&key, PutPayload::from(good)).await.unwrap();
    let model = kind.load(&ModelId::new("m").unwrap()).await.unwrap();
    assert_eq!(cache.stats().downloads, 2);
    assert!(run(&model, "m", "[[1,2,3,4]]").is_ok());
}

/// `builtin://demo` is the ONNX kind's own: every model of `examples/models/`, compiled in,
/// answering as the files on disk do; it takes no options, and a model it lacks is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_builtin_demo_repository_is_the_examples_compiled_in() {
    let config = |json: &str| -> modelmux_onnx::OnnxConfig { serde_json::from_str(json).unwrap() };
    let builtin = config(r#"{"repository": "builtin://demo"}"#)
        .repository(None)
        .await
        .unwrap();
    let compiled: Vec<&str> = modelmux_onnx::demo::DEMO_MODELS
        .iter()
        .map(|(id, _, _)| *id)
        .collect();
    assert_eq!(compiled, demo_ids());
    let (on_disk, compiled_in) = (kind(), Onnx::new(builtin));
    let body = r#"{"inputs": [[0.5, -1.2, 3.3, 0.1]]}"#;
    for name in demo_ids() {
        let id = ModelId::new(&name).unwrap();
        let (a, b) = (
            on_disk.load(&id).await.unwrap(),
            compiled_in.load(&id).await.unwrap(),
        );
        assert_eq!(run(&a, &name, body).unwrap(), run(&b, &name, body).unwrap());
    }
    let missing = compiled_in
        .load(&ModelId::new("customer-99").unwrap())
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        missing.contains("model 'customer-99' not found in builtin://demo"),
        "{missing}"
    );
    let err = config(r#"{"repository": "builtin://demo", "options": {"region": "x"}}"#)
        .repository(None)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("builtin://demo takes no options"), "{err}");
}
