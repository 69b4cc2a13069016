//! The `modelmux` binary's integration tests, in one binary (one link, the helpers compiled
//! once, one pool of test threads); `cargo test -p modelmux-cli --test cli <module>::` runs one.

mod cluster_common;
mod common;
mod netns;

mod binary;
mod cluster;
mod cluster_deploy;
mod cluster_tls;
mod dashboard;
mod deploy;
mod grafana;
mod llm;
mod llm_cluster;
mod local_admin;
mod partition;
mod plan;
mod python;
mod python_autoscaling;
mod python_cluster_calls;
mod python_handles;
mod tracing;
