//! Ray Serve's model-multiplexing example, written against modelmux.
//!
//! The guide's deployment keeps up to 3 models per replica; `get_model` loads
//! `<bucket>/<model_id>/model.pt` and `__call__` reads the model id of the request. Here the
//! models are small linear regressors stored as `<repository>/<model_id>/model.bin` (little-endian
//! f32 weights, then the bias) in a local directory, generated on first run.
//!
//! ```text
//! cargo run --example local_models                 # a temporary repository of 6 models
//! cargo run --example local_models -- ./my-models  # your own: ./my-models/<id>/model.bin
//! ```
//!
//! The HTTP server (`modelmux serve`) dispatches requests exactly like `handle` below: it sets
//! the request context from the `serve_multiplexed_model_id` header and calls the deployment.

use std::path::{Path, PathBuf};
use std::time::Duration;

use modelmux::{
    BoxError, Loader, Model, ModelId, Multiplexer, RequestContext, RequestId, multiplexed_model_id,
    request_id,
};

/// Number of input features of every model in the repository: same shape, different weights.
const FEATURES: usize = 8;

/// One customer's regressor.
struct LinearModel {
    weights: Vec<f32>,
    bias: f32,
}

impl Model for LinearModel {
    fn size_bytes(&self) -> Option<u64> {
        Some(((self.weights.len() + 1) * size_of::<f32>()) as u64)
    }

    async fn unload(self) -> Result<(), BoxError> {
        // A real model would free device memory here; this one only has a Vec to drop.
        drop(self.weights);
        Ok(())
    }
}

impl LinearModel {
    fn forward(&self, x: &[f32]) -> f32 {
        self.weights.iter().zip(x).map(|(w, x)| w * x).sum::<f32>() + self.bias
    }
}

/// Loads models from `<repository>/<model_id>/model.bin`.
struct DiskLoader {
    repository: PathBuf,
}

impl DiskLoader {
    fn path(&self, id: &ModelId) -> Result<PathBuf, BoxError> {
        // `as_relative_path` refuses ids such as `../secrets`: the repository cannot be escaped.
        Ok(self
            .repository
            .join(id.as_relative_path()?)
            .join("model.bin"))
    }
}

impl Loader<LinearModel> for DiskLoader {
    /// Before any room is made: does the model exist, and how large is it?
    async fn probe(&self, id: &ModelId) -> Result<Option<u64>, BoxError> {
        let path = self.path(id)?;
        let meta = tokio::fs::metadata(&path)
            .await
            .map_err(|e| format!("model '{id}' not found at {}: {e}", path.display()))?;
        Ok(Some(meta.len()))
    }

    async fn load(&self, id: &ModelId) -> Result<LinearModel, BoxError> {
        load_from_disk(&self.path(id)?, id).await
    }
}

/// Reads one model file.
async fn load_from_disk(path: &Path, id: &ModelId) -> Result<LinearModel, BoxError> {
    let bytes = tokio::fs::read(path)
        .await
        .map_err(|e| format!("model '{id}' not found at {}: {e}", path.display()))?;
    if bytes.len() != (FEATURES + 1) * 4 {
        return Err(format!(
            "{}: expected {} bytes, found {}",
            path.display(),
            (FEATURES + 1) * 4,
            bytes.len()
        )
        .into());
    }
    let mut values: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("chunks of 4")))
        .collect();
    let bias = values.pop().expect("FEATURES + 1 values");
    // Pretend the weights take a moment to load, as real ones do.
    tokio::time::sleep(Duration::from_millis(50)).await;
    Ok(LinearModel {
        weights: values,
        bias,
    })
}

/// The deployment: one per replica, holding that replica's model cache.
struct ModelInferencer {
    models: Multiplexer<LinearModel>,
}

impl ModelInferencer {
    fn new(repository: PathBuf) -> Self {
        let models = Multiplexer::builder()
            .max_models(3)
            .build(DiskLoader { repository });
        Self { models }
    }

    /// The request handler: which model to use comes from the request context.
    async fn call(&self, x: &[f32]) -> Result<f32, BoxError> {
        let id =
            multiplexed_model_id().ok_or("this deployment needs a serve_multiplexed_model_id")?;
        let model = self.models.get(&id).await?;
        Ok(model.forward(x))
    }
}

/// What the ingress does for each request: set the context, call the deployment.
async fn handle(inferencer: &ModelInferencer, model_id: &str, x: &[f32]) -> Result<f32, BoxError> {
    let context = RequestContext::new()
        .with_request_id(RequestId::generate())
        .with_multiplexed_model_id(ModelId::new(model_id)?);
    context
        .scope(async {
            let y = inferencer.call(x).await;
            tracing::debug!(request_id = %request_id().unwrap(), model_id, ok = y.is_ok(), "request served");
            y
        })
        .await
}

/// Writes `count` models with deterministic weights (model `k` has every weight `k / 10`).
fn write_demo_repository(dir: &Path, count: usize) -> std::io::Result<()> {
    for k in 1..=count {
        let model_dir = dir.join(k.to_string());
        std::fs::create_dir_all(&model_dir)?;
        let values: Vec<u8> = (0..=FEATURES)
            .map(|i| if i == FEATURES { 1.0 } else { k as f32 / 10.0 })
            .flat_map(f32::to_le_bytes)
            .collect();
        std::fs::write(model_dir.join("model.bin"), values)?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();

    let temp;
    let repository = match std::env::args().nth(1) {
        Some(dir) => PathBuf::from(dir),
        None => {
            temp = tempfile::tempdir()?;
            write_demo_repository(temp.path(), 6)?;
            temp.path().to_path_buf()
        }
    };
    println!("model repository: {}", repository.display());
    let inferencer = std::sync::Arc::new(ModelInferencer::new(repository));
    let x = [1.0; FEATURES];

    println!("\n-- requests for models 1, 2, 1, 3: three loads, then a hit");
    for id in ["1", "2", "1", "3"] {
        println!("model {id}: y = {}", handle(&inferencer, id, &x).await?);
    }

    println!("\n-- model 4 needs a slot: the least recently used idle model (2) is evicted");
    println!("model 4: y = {}", handle(&inferencer, "4", &x).await?);

    println!("\n-- 50 concurrent first requests for model 5: one load, shared by all");
    let loads_before = inferencer.models.metrics().loads;
    let mut burst = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let inferencer = inferencer.clone();
        burst.spawn(async move {
            handle(&inferencer, "5", &x)
                .await
                .map_err(|e| e.to_string())
        });
    }
    let answers: Result<Vec<f32>, String> = burst.join_all().await.into_iter().collect();
    let answers = answers?;
    let loads = inferencer.models.metrics().loads - loads_before;
    println!(
        "{} answers, y = {}, loads for the whole burst: {loads}",
        answers.len(),
        answers[0]
    );

    println!("\n-- bad requests get clear errors; a missing model evicts nothing");
    for id in ["missing", "../etc", ""] {
        match handle(&inferencer, id, &x).await {
            Ok(y) => println!("{id:?}: unexpectedly y = {y}"),
            Err(e) => println!("{id:?}: {e}"),
        }
    }

    let m = inferencer.models.metrics();
    println!(
        "\nget requests {}, hits {}, loads {}, load failures {}, evictions {}, loaded now: {:?}",
        m.get_requests,
        m.hits,
        m.loads,
        m.load_failures,
        m.evictions,
        inferencer
            .models
            .models()
            .iter()
            .map(|m| m.id.to_string())
            .collect::<Vec<_>>()
    );
    let report = inferencer.models.shutdown(Duration::from_secs(5)).await;
    println!("shutdown: {report:?}");
    Ok(())
}
