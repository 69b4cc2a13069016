//! Base models loaded in this process, by file. Replicas of a deployment that load the same
//! GGUF file (same path, size and modification time) in the same format and length get one
//! copy of the weights, and so share their steps (`LlamaModel::forward_shared`): N replicas
//! in a process hold the weights once and read them once per step. A model is freed when the
//! last engine holding it lets go (asleep or gone); the next load reads the file again.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Weak};
use std::time::SystemTime;

use parking_lot::Mutex;

use crate::error::{LlmError, Result};
use crate::model::LlamaModel;
use crate::weights::WeightFormat;

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    path: PathBuf,
    len: u64,
    modified: Option<SystemTime>,
    format: WeightFormat,
    max_len: usize,
}

/// Per file, the model loaded from it while anyone holds it. Each slot has its own lock,
/// held while its file loads: a second replica waits for the first one's load rather than
/// reading a second copy, and loads of other files go on meanwhile.
type Slot = Arc<Mutex<Weak<LlamaModel>>>;
static LOADED: LazyLock<Mutex<HashMap<Key, Slot>>> = LazyLock::new(Default::default);

/// The model of the GGUF file at `path` in `format` for `max_len` positions: the one this
/// process already holds, or what `load` makes (then held for the next caller).
pub(crate) fn shared_model(
    path: &Path,
    format: WeightFormat,
    max_len: usize,
    load: impl FnOnce() -> Result<LlamaModel>,
) -> Result<Arc<LlamaModel>> {
    let unreadable = |e: std::io::Error| LlmError::InvalidGguf {
        path: path.display().to_string(),
        message: format!("cannot open: {e}"),
    };
    let metadata = std::fs::metadata(path).map_err(unreadable)?;
    let key = Key {
        path: path.canonicalize().map_err(unreadable)?,
        len: metadata.len(),
        modified: metadata.modified().ok(),
        format,
        max_len,
    };
    let slot = {
        let mut loaded = LOADED.lock();
        // Files nobody holds any more (an unlocked slot is not loading).
        loaded.retain(|_, slot| slot.try_lock().is_none_or(|m| m.strong_count() > 0));
        loaded.entry(key).or_default().clone()
    };
    let mut held = slot.lock();
    if let Some(model) = held.upgrade() {
        return Ok(model);
    }
    let model = Arc::new(load()?);
    *held = Arc::downgrade(&model);
    Ok(model)
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use candle_core::quantized::gguf_file::{self, Value};
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::weights::LlamaWeights;

    /// A one-layer llama of width 8 over 8 tokens, written to `path` (so `shared_model` has a
    /// file to key by and the loads something to read).
    fn write_tiny(path: &Path) {
        let tensor = |shape: &[usize]| {
            let n = shape.iter().product();
            let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32 / 10.0).collect();
            let t = Tensor::from_vec(data, shape, &Device::Cpu).unwrap();
            QTensor::quantize(&t, GgmlDType::F32).unwrap()
        };
        let metadata = [
            ("general.architecture", Value::String("llama".into())),
            ("llama.block_count", Value::U32(1)),
            ("llama.context_length", Value::U32(16)),
            ("llama.embedding_length", Value::U32(8)),
            ("llama.feed_forward_length", Value::U32(8)),
            ("llama.attention.head_count", Value::U32(2)),
            ("llama.attention.head_count_kv", Value::U32(2)),
            ("llama.vocab_size", Value::U32(8)),
        ];
        let mut tensors = vec![
            ("token_embd.weight".to_owned(), tensor(&[8, 8])),
            ("output_norm.weight".to_owned(), tensor(&[8])),
        ];
        for name in ["attn_norm", "ffn_norm"] {
            tensors.push((format!("blk.0.{name}.weight"), tensor(&[8])));
        }
        for name in [
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        ] {
            tensors.push((format!("blk.0.{name}.weight"), tensor(&[8, 8])));
        }
        let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
        let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, t)| (k.as_str(), t)).collect();
        let mut out = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut out, &metadata, &tensors).unwrap();
    }

    /// What a replica does (`LlmRuntime::load` and its reloader): asks the registry for the
    /// model of `path`, loading it if nobody holds it; `loads` counts the file's reads.
    fn replica(path: &Path, loads: &AtomicUsize) -> Arc<LlamaModel> {
        shared_model(path, WeightFormat::default(), 16, || {
            loads.fetch_add(1, Ordering::SeqCst);
            let weights = LlamaWeights::load(path, WeightFormat::default())?;
            Ok(LlamaModel::new(weights, 16))
        })
        .unwrap()
    }

    /// Replicas of one file get one copy of its weights, read once; another file gets its own;
    /// once the last holder lets go, the copy is freed and the next replica reads the file
    /// again.
    #[test]
    fn replicas_of_one_file_share_one_model_until_the_last_lets_go() {
        // Files of this test's own (the registry is process-wide).
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.gguf"), dir.path().join("b.gguf"));
        write_tiny(&a);
        write_tiny(&b);
        let (a_loads, b_loads) = (AtomicUsize::new(0), AtomicUsize::new(0));

        let first = replica(&a, &a_loads);
        let second = replica(&a, &a_loads);
        assert!(Arc::ptr_eq(&first, &second), "two replicas, two copies");
        assert_eq!(a_loads.load(Ordering::SeqCst), 1, "the file read twice");
        // The registry itself holds no strong reference: only the two replicas do.
        assert_eq!(Arc::strong_count(&first), 2);

        // The same file by another spelling of its path is the same file.
        let spelled = dir.path().join(".").join("a.gguf");
        let third = replica(&spelled, &a_loads);
        assert!(Arc::ptr_eq(&first, &third));
        assert_eq!(a_loads.load(Ordering::SeqCst), 1);
        drop(third);

        let other = replica(&b, &b_loads);
        assert!(!Arc::ptr_eq(&first, &other), "another file, the same model");
        assert_eq!(b_loads.load(Ordering::SeqCst), 1);
        assert_eq!(a_loads.load(Ordering::SeqCst), 1);

        // One replica gone (or asleep): the other still holds the weights, nothing is read.
        let weak = Arc::downgrade(&first);
        drop(first);
        let again = replica(&a, &a_loads);
        assert!(Arc::ptr_eq(&again, &second));
        assert_eq!(a_loads.load(Ordering::SeqCst), 1);

        // Every holder gone: the weights are freed, and the next replica reads the file again.
        drop((second, again));
        assert!(
            weak.upgrade().is_none(),
            "the registry kept the model alive"
        );
        let reloaded = replica(&a, &a_loads);
        assert_eq!(a_loads.load(Ordering::SeqCst), 2);
        assert_eq!(Arc::strong_count(&reloaded), 1);
        // ... and that new copy is shared again.
        let with_it = replica(&a, &a_loads);
        assert!(Arc::ptr_eq(&reloaded, &with_it));
        assert_eq!(a_loads.load(Ordering::SeqCst), 2);
        drop(other);
    }
}
