//! Python deployments: a Ray Serve application (`@serve.deployment`, `@serve.multiplexed`,
//! handles) served by modelmux with one changed import.
//!
//! Each replica is a worker process (`python -m modelmux._worker`, from the `modelmux` Python
//! package in `python/`) that this crate starts, watches and restarts: one interpreter per
//! replica, as Ray runs one actor per replica. The Rust side keeps everything that decides —
//! the ingress, routing to the replicas holding a model, queues, and the replica's model cache
//! (which model to load, which to evict, single flight, caps, failure backoff) — and the worker
//! holds the Python objects: it runs the user's loader when the cache orders a load and drops
//! the object when the cache unloads it. They talk over a Unix socket in frames
//! (`docs/python-worker-protocol.md`).
//!
//! - [`PythonApp::inspect`] imports an application and lists its deployments;
//! - [`PythonApp::deployment_spec`] makes one of them a deployment the serve layer runs.

mod callbacks;
mod calls;
mod conn;
mod inspect;
mod model;
mod process;
mod replica;
mod request;
mod supervisor;
mod wire;

pub use inspect::{
    DeploymentOptions, MultiplexedOptions, PythonApp, PythonDeployment, PythonError, default_python,
};
