//! What the tests that run SmolLM2 share: the model, loaded once per test binary, the
//! adapters, and the reference's numbers.
#![allow(dead_code, unreachable_pub)]

pub mod family_files;
pub mod gguf_bytes;
pub mod tiny;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use modelmux_llm::{
    AdapterPrecision, Engine, EngineConfig, GgufFile, LlamaModel, LlamaWeights, LoraAdapter,
    TextTokenizer, WeightFormat,
};

/// A directory of this test process's own, `name-<pid>` under the target's scratch directory
/// (the models written there are 200 MB); those left by test processes that are gone are
/// removed first, so runs do not pile them up.
pub fn scratch(name: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let prefix = format!("{name}-");
    for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
        let file = entry.file_name();
        let pid = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && pid != std::process::id()
            && !std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    let dir = root.join(format!("{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A variable the test command sets; its absence fails the test.
pub fn env_path(name: &str) -> PathBuf {
    let value = std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with ./scripts/test, which fetches the model and writes the adapters and the reference")
    });
    PathBuf::from(value)
}

pub struct Runtime {
    model: Arc<LlamaModel>,
    /// How adapters are stored: as the runtime stores them with these weights.
    precision: AdapterPrecision,
    pub tokenizer: Arc<TextTokenizer>,
    adapters: parking_lot::Mutex<HashMap<String, Arc<LoraAdapter>>>,
}

impl Runtime {
    pub fn model(&self) -> &Arc<LlamaModel> {
        &self.model
    }

    /// An engine over the shared model.
    pub fn engine(&self, config: EngineConfig) -> Engine {
        Engine::start(self.model.clone(), self.tokenizer.clone(), config).unwrap()
    }

    /// Adapter `id` stored in `precision` (not kept).
    pub fn adapter_in(&self, id: &str, precision: AdapterPrecision) -> Arc<LoraAdapter> {
        let dir = env_path("MODELMUX_TEST_ADAPTERS").join(id);
        let config = std::fs::read(dir.join("adapter_config.json")).unwrap();
        let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
        Arc::new(
            LoraAdapter::from_peft_in(id, &config, &weights, self.model.config(), precision)
                .unwrap(),
        )
    }

    pub fn adapter(&self, id: &str) -> Arc<LoraAdapter> {
        let mut adapters = self.adapters.lock();
        adapters
            .entry(id.to_owned())
            .or_insert_with(|| {
                let dir = env_path("MODELMUX_TEST_ADAPTERS").join(id);
                let config = std::fs::read(dir.join("adapter_config.json")).unwrap();
                let weights = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
                Arc::new(
                    LoraAdapter::from_peft_in(
                        id,
                        &config,
                        &weights,
                        self.model.config(),
                        self.precision,
                    )
                    .unwrap(),
                )
            })
            .clone()
    }
}

fn load(format: WeightFormat) -> Runtime {
    let path = env_path("MODELMUX_TEST_GGUF");
    let file = GgufFile::open(&path).unwrap();
    let tokenizer = TextTokenizer::from_gguf(&file).unwrap();
    drop(file);
    let weights = LlamaWeights::load(&path, format).unwrap();
    Runtime {
        model: Arc::new(LlamaModel::new(weights, 2048)),
        precision: AdapterPrecision::for_weights(format),
        tokenizer: Arc::new(tokenizer),
        adapters: Default::default(),
    }
}

/// SmolLM2 as the engine runs it by default (quantized), loaded once per test binary.
pub fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| load(WeightFormat::default()))
}

/// SmolLM2 with every weight dequantized to f32: the same arithmetic as the reference.
pub fn runtime_f32() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| load(WeightFormat::F32))
}

#[derive(serde::Deserialize)]
pub struct Case {
    pub name: String,
    pub adapter: Option<String>,
    pub prompt_ids: Vec<u32>,
    pub last_logits: Vec<f32>,
    pub greedy: Vec<u32>,
    pub greedy_margins: Vec<f32>,
    pub embedding: Vec<f32>,
}

#[derive(serde::Deserialize)]
pub struct Reference {
    pub cases: Vec<Case>,
}

impl Reference {
    pub fn load() -> Self {
        let path = env_path("MODELMUX_TEST_LLM_REFERENCE");
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap()
    }
}

/// Waits (bounded) until `engine` holds no sequence and no KV memory (but its prefix cache's,
/// which is free for sequences); fails the test if it does not.
pub async fn settled(engine: &Engine) {
    for _ in 0..200 {
        let s = engine.snapshot();
        if s.running == 0 && s.waiting == 0 && s.kv_reserved_bytes == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!(
        "the engine did not release everything: {:?}",
        engine.snapshot()
    );
}

/// Runs the numpy reference (`scripts/llm/reference.py`) on `gguf` for `prompt` with `extra`
/// arguments (`--adapter DIR`, `--llama3 ...`, `--prompt-logprobs K`), and returns what it
/// writes: `{"last_logits", ...}`. Fails the test if it fails.
pub fn reference_py(
    gguf: &std::path::Path,
    prompt: &[u32],
    extra: &[&std::ffi::OsStr],
) -> serde_json::Value {
    static RUN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!(
        "modelmux-reference-{}-{n}.json",
        std::process::id()
    ));
    let ids: Vec<String> = prompt.iter().map(u32::to_string).collect();
    let weights_only = out.with_extension("gguf");
    without_tokenizer(gguf, &weights_only);
    let status = std::process::Command::new(env_path("MODELMUX_TEST_PYTHON"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/llm/reference.py"
        ))
        .arg("--gguf")
        .arg(&weights_only)
        .arg("--prompt-ids")
        .arg(ids.join(","))
        .arg("--out")
        .arg(&out)
        .args(extra)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "reference.py failed on {}",
        gguf.display()
    );
    let doc = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&weights_only);
    doc
}

/// Copies the GGUF file `from` to `to` without its `tokenizer.*` metadata. Given token ids,
/// the reference needs no tokenizer, and gguf-py's reader parses every metadata array element
/// by element: SmolLM2's 49k tokens and merges took it 4-5 s of the 5 s a tiny model's
/// reference took.
fn without_tokenizer(from: &std::path::Path, to: &std::path::Path) {
    use candle_core::quantized::gguf_file;
    let mut file = std::fs::File::open(from).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("tokenizer."))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    // In the file's order, as the reference would have read them.
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort_by_key(|n| content.tensor_infos[*n].offset);
    let tensors: Vec<(&str, candle_core::quantized::QTensor)> = names
        .into_iter()
        .map(|name| {
            let tensor = content
                .tensor(&mut file, name, &candle_core::Device::Cpu)
                .unwrap();
            (name.as_str(), tensor)
        })
        .collect();
    let tensors: Vec<(&str, &candle_core::quantized::QTensor)> =
        tensors.iter().map(|(n, t)| (*n, t)).collect();
    gguf_file::write(&mut std::fs::File::create(to).unwrap(), &metadata, &tensors).unwrap();
}

/// The `last_logits` of a [`reference_py`] answer.
pub fn last_logits_of(doc: &serde_json::Value) -> Vec<f32> {
    doc["last_logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect()
}
