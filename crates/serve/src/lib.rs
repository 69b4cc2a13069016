//! `modelmux-serve`: turns model caches into a server.
//!
//! - [`DeploymentSpec`] / [`Deployment`]: what runs in each replica; [`ReplicaContext`] builds
//!   the replica's [`Multiplexer`](modelmux_cache::Multiplexer) and registers it for routing.
//! - The router sends each request to a replica that holds its model (router.rs has the rules),
//!   fed by the replicas' cache events the moment they happen.
//! - [`Server`]: the HTTP ingress (`serve_multiplexed_model_id` header, `x-request-id`,
//!   `x-modelmux-replica`), the admin API under `/-/`, and `/metrics`.
//! - [`DeploymentHandle`]: one deployment calling another.
//! - [`ModelKind`] / [`model_deployment`]: a ready-made deployment that serves any model kind.
//!
//! This crate knows nothing of model formats; model kinds live in their own crates.

mod admin;
mod body;
mod cluster_api;
mod custom_metrics;
mod deployment;
mod dispatch;
mod error;
mod front;
mod handle;
mod ingress;
mod metrics;
mod model;
mod placement;
mod redact;
mod remote;
mod replica;
mod router;
mod server;

pub use admin::{AdminAccess, is_reserved_route_prefix};
pub use body::{Body, BodyError, BodySender, bearer_token_matches, json_response};
pub use cluster_api::NodeHandle;
pub use custom_metrics::{MetricFamily, MetricKind, MetricSample, MetricValue, MetricsSource};
pub use deployment::{Deployment, DeploymentConfig, DeploymentSpec, ReplicaContext};
pub use dispatch::waiting_for_load;
pub use error::ServeError;
pub use front::{HttpOptions, MAX_BUF_BYTES};
pub use handle::{DeploymentHandle, HandleOptions};
pub use ingress::{MODEL_ID_HEADER, MODEL_ID_HEADER_DASHED, REPLICA_HEADER, REQUEST_ID_HEADER};
pub use model::{ModelKind, model_deployment};
pub use modelmux_cache::BoxError;
pub use placement::{CopyReport, Holding, ReplicaSlot, ReplicaView};
pub use remote::{
    DeploymentState, FORWARDED_HEADER, ForwardError, Forwarder, NOT_HERE_HEADER, ReplicaState,
};
pub use router::{Choice, Reason, Rng, choose, choose_with, place, rendezvous_score};
pub use server::{Application, Server, ServerBuilder, ServerConfig, StartError};

/// A request as deployments see it.
pub type Request = http::Request<Body>;
/// A response as deployments return it.
pub type Response = http::Response<Body>;
