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
