//! Adapters as models in the cache: loaded on demand from a model repository through the
//! runtime's `Multiplexer`, capped in count, held while a sequence uses them, unloaded once;
//! and every way an adapter can be wrong is a typed error naming what is wrong.

use crate::common;

use std::path::Path;

use common::env_path;
use modelmux_llm::{AdapterPrecision, ErrorKind, LlmRuntime, RuntimeOptions, SamplingParams};
use modelmux_store::{ModelRepository, RepositoryOptions};

async fn runtime_over(dir: &Path, max_adapters: usize) -> LlmRuntime {
    let repository =
        ModelRepository::open(dir.to_str().unwrap(), RepositoryOptions::default()).unwrap();
    LlmRuntime::load(
        env_path("MODELMUX_TEST_GGUF"),
        Some(repository),
        RuntimeOptions {
            model_id: "smollm2".into(),
            max_adapters,
            ..RuntimeOptions::default()
        },
    )
    .await
    .unwrap()
}

fn copy_adapter(from: &str, to: &Path, id: &str) {
    let src = env_path("MODELMUX_TEST_ADAPTERS").join(from);
    let dst = to.join(id);
    std::fs::create_dir_all(&dst).unwrap();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(src.join(file), dst.join(file)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_load_on_demand_within_the_cap_and_unload_after_their_last_sequence() {
    let rt = runtime_over(&env_path("MODELMUX_TEST_ADAPTERS"), 2).await;
    let cache = rt.adapters().unwrap();
    let pirate = rt.adapter("pirate").await.unwrap();
    let prompt = rt.tokenizer().encode("Hello", false).unwrap();
    let params = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::greedy(2000)
    };
    let running = rt.generate(prompt.clone(), params, Some(pirate)).unwrap();
    drop(rt.adapter("tutor").await.unwrap());
    drop(rt.adapter("chef").await.unwrap());
    // pirate is in use: the idle tutor made room for chef.
    let mut held: Vec<String> = cache.loaded_ids().iter().map(|id| id.to_string()).collect();
    held.sort();
    assert_eq!(held, ["chef", "pirate"]);
    assert!(cache.evict("pirate"));
    assert_eq!(
        cache.metrics().unloads,
        1,
        "only tutor is unloaded while pirate runs"
    );
    drop(running);
    for _ in 0..300 {
        if cache.metrics().unloads == 2 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(
        cache.metrics().unloads,
        2,
        "pirate's memory goes with its last sequence"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_adapters_are_typed_errors_that_name_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Truncated weights.
    copy_adapter("pirate", root, "truncated");
    let weights = root.join("truncated/adapter_model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    // Garbage weights.
    copy_adapter("pirate", root, "garbage");
    std::fs::write(
        root.join("garbage/adapter_model.safetensors"),
        b"\xff\xff\xff\xffnot safetensors",
    )
    .unwrap();
    // An unsupported setting.
    copy_adapter("pirate", root, "dora");
    let config = root.join("dora/adapter_config.json");
    let mut json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    json["use_dora"] = true.into();
    std::fs::write(&config, json.to_string()).unwrap();
    // Made for a model with other shapes: rank 8 over a 100-wide input.
    std::fs::create_dir_all(root.join("other-base")).unwrap();
    std::fs::write(
        root.join("other-base/adapter_config.json"),
        r#"{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"]}"#,
    )
    .unwrap();
    let a = vec![0u8; 8 * 100 * 4];
    let b = vec![0u8; 100 * 8 * 4];
    let tensors = [
        (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![8, 100], &a)
                .unwrap(),
        ),
        (
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![100, 8], &b)
                .unwrap(),
        ),
    ];
    safetensors::serialize_to_file(
        tensors,
        None,
        &root.join("other-base/adapter_model.safetensors"),
    )
    .unwrap();

    let rt = runtime_over(root, 4).await;
    let cases = [
        ("missing", ErrorKind::NotFound, "not found in"),
        ("truncated", ErrorKind::UnusableModel, "safetensors"),
        ("garbage", ErrorKind::UnusableModel, "safetensors"),
        ("dora", ErrorKind::UnusableModel, "use_dora"),
        ("other-base", ErrorKind::UnusableModel, "another base model"),
        ("../pirate", ErrorKind::InvalidInput, "pirate"),
    ];
    for (id, kind, message) in cases {
        let Err(err) = rt.adapter(id).await else {
            panic!("{id} loaded");
        };
        assert_eq!(err.kind(), kind, "{id}: {err}");
        assert!(
            err.to_string().contains(message),
            "{id}: '{err}' should say {message}"
        );
    }
    let cache = rt.adapters().unwrap();
    assert!(cache.loaded_ids().is_empty());
    assert_eq!(cache.gauges().used_bytes, 0, "failed loads hold nothing");
    assert_eq!(cache.gauges().used_slots, 0);
}

/// `RuntimeOptions::adapter_precision` reaches the adapters the runtime loads: int8 holds a
/// little over half the bytes of binary16 (the rows' scales are the rest), and the runtime's
/// default with quantized weights is binary16.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_adapter_precision_chosen_is_the_one_loaded() {
    let dir = env_path("MODELMUX_TEST_ADAPTERS");
    let bytes = |precision| {
        let dir = dir.clone();
        async move {
            let repository =
                ModelRepository::open(dir.to_str().unwrap(), RepositoryOptions::default()).unwrap();
            let options = RuntimeOptions {
                adapter_precision: precision,
                ..RuntimeOptions::default()
            };
            let rt = LlmRuntime::load(env_path("MODELMUX_TEST_GGUF"), Some(repository), options)
                .await
                .unwrap();
            rt.adapter("pirate").await.unwrap().size_bytes()
        }
    };
    let default = bytes(None).await;
    let half = bytes(Some(AdapterPrecision::Half)).await;
    let int8 = bytes(Some(AdapterPrecision::Int8)).await;
    let exact = bytes(Some(AdapterPrecision::Exact)).await;
    assert_eq!(default, half, "binary16 by default with quantized weights");
    assert_eq!(exact, 2 * half);
    assert!(
        int8 > half / 2 && int8 < half * 11 / 20,
        "int8 {int8} bytes against binary16's {half}"
    );
}
