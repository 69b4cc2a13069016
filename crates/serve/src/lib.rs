//! `modelmux-serve`: turns model caches into a server.
//!
//! - [`DeploymentSpec`] / [`Deployment`]: what runs in each replica; [`ReplicaContext`] builds
//!   the replica's [`Multiplexer`](modelmux_cache::Multiplexer) and registers it for routing.
//! - The router sends each request to a replica that holds its model (router.rs has the rules),
//!   fed by the replicas' cache events the moment they happen.
//! - [`Controller`]: the applications of a process, running: starts their replicas, checks
//!   their health, drains and stops them, and reports their models and counters. The HTTP
//!   front (`modelmux-front`) serves it; every request reaches a deployment through the
//!   [`Dispatch`] port.
//! - [`DeploymentHandle`]: one deployment calling another.
//! - [`ModelKind`] / [`model_deployment`]: a ready-made deployment that serves any model kind.
//!
//! This crate knows nothing of model formats; model kinds live in their own crates.

mod access;
mod autoscale;
mod body;
mod controller;
mod custom_metrics;
mod deployment;
mod deployment_router;
mod dispatch;
mod error;
mod handle;
mod identity;
mod model;
mod model_cache;
mod placement;
mod redact;
mod remote;
mod replica;
mod router;

pub use access::{AdminAccess, is_admin_path, is_reserved_route_prefix};
pub use autoscale::{Aggregation, AutoscalingConfig};
pub(crate) use body::bearer_token_matches;
pub use body::{Body, BodySender, json_response};
pub use controller::{
    AppModels, AppState, Application, ControlAnswer, Controller, DeploymentModels, Health,
    LoadedModel, MetricsReport, ModelsReport, NodeHandle, Operations, QueueReport, Reconfiguration,
    ReplicaMetrics, ReplicaModels,
};
pub use custom_metrics::{
    DashboardSeries, MetricFamily, MetricKind, MetricSample, MetricValue, MetricsSource,
};
pub use deployment::{Deployment, DeploymentConfig, DeploymentSpec, ReplicaContext};
pub use deployment_router::waiting_for_load;
pub use dispatch::{
    Dispatch, Dispatched, HandleCall, Route, STREAM_HEADER, ServedModel, access_log_on,
};
pub use error::{ErrorType, ServeError, StartError};
pub use handle::DeploymentHandle;
pub use identity::{NONCE_HEADER, PROOF_HEADER, identity_proof, proof_matches};
pub use model::{ModelKind, model_deployment};
pub use modelmux_cache::BoxError;
pub(crate) use placement::ReplicaView;
pub use placement::{CopyReport, Holding};
pub use remote::{
    DeploymentState, FORWARDED_HEADER, ForwardError, Forwarder, NOT_HERE_HEADER, PEER_TOKEN_HEADER,
    ReplicaState, forwarded_by_peer,
};
pub use router::{Choice, Reason, Rng, choose, place};

/// A request as deployments see it.
pub type Request = http::Request<Body>;
/// A response as deployments return it.
pub type Response = http::Response<Body>;
