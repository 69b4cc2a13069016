//! Cold-load throughput of one model: how fast modelmux turns bytes in a repository into a
//! model ready to serve, split into its stages. Each run uses a fresh disk cache, so a remote
//! model is downloaded every time.
//!
//! ```text
//! cargo run --release -p modelmux-onnx --example load_throughput -- \
//!     <repository> <model_id> [runs] [key=value store options...] [verify_md5=false]
//! ```
//!
//! Prints one JSON object: the model's size and, per stage, the best time over the runs and
//! its throughput in MiB/s: `fetch` (the file on local disk: a download into the disk cache
//! for remote repositories, nothing for local ones), `read` (its bytes in memory), `parse`
//! (tract parses and optimizes it), and `load` (what a replica does: all of them).
//! `scripts/bench-load` compares these with raw reads of the same bytes.

use std::time::Duration;

use tokio::time::Instant;

use modelmux_cache::ModelId;
use modelmux_onnx::{MODEL_FILE, OnnxModel};
use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [repository, id, rest @ ..] = args.as_slice() else {
        return Err("usage: load_throughput <repository> <model_id> [runs] [key=value ...]".into());
    };
    let (runs, options) = match rest.split_first() {
        Some((n, options)) if !n.contains('=') => (n.parse::<usize>()?, options),
        _ => (3, rest),
    };
    let options: Vec<(String, String)> = options
        .iter()
        .map(|kv| {
            let (k, v) = kv.split_once('=').ok_or("options are key=value")?;
            Ok::<_, &str>((k.to_string(), v.to_string()))
        })
        .collect::<Result<_, _>>()?;
    // `verify_md5=false` is ours, not the store's.
    let verify_md5 = !options
        .iter()
        .any(|(k, v)| k == "verify_md5" && v == "false");
    let options: Vec<(String, String)> = options
        .into_iter()
        .filter(|(k, _)| k != "verify_md5")
        .collect();
    let id = ModelId::new(id)?;
    let mut best = [Duration::MAX; 6];
    let mut size = 0;
    for _ in 0..runs.max(1) {
        let remote = repository.contains("://") && !repository.starts_with("file://");
        let cache = remote.then(|| DiskCache::temporary(u64::MAX)).transpose()?;
        let repo = ModelRepository::open(
            repository,
            RepositoryOptions {
                options: options.clone(),
                disk_cache: cache,
                verify_md5,
                ..Default::default()
            },
        )?;
        let start = Instant::now();
        let file = repo.fetch(&id, MODEL_FILE).await?;
        let fetched = start.elapsed();
        let bytes = file.bytes().await?;
        let read = start.elapsed() - fetched;
        size = bytes.len() as u64;
        let parse_start = Instant::now();
        let model = tokio::task::spawn_blocking(move || OnnxModel::from_bytes(&bytes)).await??;
        let parse = parse_start.elapsed();
        let load = start.elapsed();
        drop(model);
        // The parse again, in its two halves: decoding the protobuf, optimizing the graph.
        let bytes = file.bytes().await?;
        let (decode, optimize) = tokio::task::spawn_blocking(move || {
            use modelmux_onnx::tract_onnx::prelude::*;
            let t = Instant::now();
            let model = tract_onnx::onnx().model_for_read(&mut std::io::Cursor::new(&bytes[..]))?;
            let decode = t.elapsed();
            let t = Instant::now();
            let plan = model.into_optimized()?.into_runnable()?;
            drop(plan);
            Ok::<_, TractError>((decode, t.elapsed()))
        })
        .await??;
        for (b, t) in best
            .iter_mut()
            .zip([fetched, read, parse, load, decode, optimize])
        {
            *b = (*b).min(t);
        }
    }
    let mib = size as f64 / f64::from(1 << 20);
    let stage = |t: Duration| serde_json::json!({"seconds": t.as_secs_f64(), "mib_per_s": mib / t.as_secs_f64().max(1e-9)});
    let report = serde_json::json!({
        "repository": repository,
        "model_id": id.as_str(),
        "bytes": size,
        "runs": runs,
        "fetch": stage(best[0]),
        "read": stage(best[1]),
        "parse": stage(best[2]),
        "load": stage(best[3]),
        "parse_decode": stage(best[4]),
        "parse_optimize": stage(best[5]),
    });
    println!("{report}");
    Ok(())
}
