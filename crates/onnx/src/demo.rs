//! The demo model repository, compiled into this kind so `modelmux serve` works anywhere with
//! no files around: the eight classifiers of `examples/models/` (see its `generate.py`), served
//! from an in-memory object store as `builtin://demo` (what [`OnnxConfig::repository`]
//! opens for that location).
//!
//! [`OnnxConfig::repository`]: crate::OnnxConfig::repository

use std::sync::Arc;

use modelmux_store::object_store::memory::InMemory;
use modelmux_store::object_store::path::Path;
use modelmux_store::object_store::{ObjectStoreExt, PutPayload};
use modelmux_store::{ModelRepository, RetryPolicy, StoreError};

macro_rules! demo {
    ($($id:literal),* $(,)?) => {
        &[$((
            $id,
            include_bytes!(concat!("../../../examples/models/", $id, "/model.onnx")).as_slice(),
            include_str!(concat!("../../../examples/models/", $id, "/reference.json")),
        )),*]
    };
}

/// The repository that means "the demo models compiled into this binary".
pub const BUILTIN_DEMO_REPOSITORY: &str = "builtin://demo";

/// `(model id, model.onnx, reference.json)` of each demo model.
pub const DEMO_MODELS: &[(&str, &[u8], &str)] = demo!(
    "customer-1",
    "customer-2",
    "customer-3",
    "customer-4",
    "customer-5",
    "customer-6",
    "customer-7",
    "customer-8",
);

/// The demo models as a repository.
pub async fn repository() -> Result<ModelRepository, StoreError> {
    let store = InMemory::new();
    for (id, model, reference) in DEMO_MODELS {
        for (file, bytes) in [
            ("model.onnx", *model),
            ("reference.json", reference.as_bytes()),
        ] {
            store
                .put(
                    &Path::from_iter([*id, file]),
                    PutPayload::from_static(bytes),
                )
                .await
                .map_err(|e| StoreError::Config(format!("demo model {id}: {e}")))?;
        }
    }
    ModelRepository::from_store(
        BUILTIN_DEMO_REPOSITORY,
        Arc::new(store),
        "",
        None,
        RetryPolicy::default(),
    )
}
