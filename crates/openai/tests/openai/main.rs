//! The OpenAI API's integration tests, in one binary (one link, the helpers compiled once,
//! one pool of test threads); `cargo test -p modelmux-openai --test openai <module>::` runs one.

mod common;

mod adapter_controls;
mod adapter_sources;
mod api;
mod batch;
mod idle_sleep;
mod limits;
mod messages_api;
mod prefix_cache;
mod prometheus;
mod responses_api;
mod routing;
mod sampling;
mod score;
mod startup;
mod streaming;
mod vllm_metrics;
