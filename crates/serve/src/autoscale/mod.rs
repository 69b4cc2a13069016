//! Autoscaling, the pure part: Ray Serve's `autoscaling_config` keys and meanings
//! ([`AutoscalingConfig`]), Ray's decision ([`policy`]) and the look-back window it reads
//! ([`window`]). The loop that measures a deployment, decides and scales it is the
//! controller's (`controller/autoscaling.rs`), through the same add-and-drain as a live
//! reconfiguration.

mod config;
pub(crate) mod policy;
pub(crate) mod window;

pub use config::{Aggregation, AutoscalingConfig};
