//! `modelmux-front`: the HTTP front of a modelmux server, above the serve layer.
//!
//! - [`Server`]: listens, and puts every request through the front door's limits
//!   ([`HttpOptions`]: connections, header and body timeouts, idle keep-alive, in-flight
//!   requests and body bytes, the request timeout) before the ingress: the request id, the
//!   `serve_multiplexed_model_id` header, the application by route prefix, and the
//!   application's ingress deployment reached through [`Dispatch`](modelmux_serve::Dispatch).
//! - The admin API under `/-/` (and `/health`), and `/metrics` in the Prometheus text format,
//!   rendered from what the serve layer's [`Controller`](modelmux_serve::Controller) reports;
//!   the dashboard at `/-/dashboard`, a page embedded in the binary fed by a ring of samples.
//! - One access line per application request (admin and `/metrics` requests have none),
//!   formatted on its task.
//!
//! It knows nothing of routing, replicas or models beyond what the controller reports: the
//! serve layer never imports from here.

mod access_log;
mod admin;
mod body_budget;
mod connection;
mod dashboard;
mod ingress;
mod metrics;
mod options;
mod otlp;
mod server;
mod state;

pub use access_log::{AccessFormat, AccessSink};
pub use ingress::{
    MODEL_ID_HEADER, MODEL_ID_HEADER_DASHED, REPLICA_HEADER, REQUEST_ID_HEADER, TRACEPARENT,
};
pub use options::{HttpOptions, MAX_BUF_BYTES, ServerConfig};
pub use otlp::TracingOptions;
pub use server::{Deployer, Server, ServerBuilder};

/// A response of the server (the serve layer's body type).
type Response = modelmux_serve::Response;
