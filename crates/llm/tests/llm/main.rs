//! The LLM runtime's integration tests, in one binary: one link instead of fifteen, the
//! shared helpers (`common`) compiled once, and every test in one pool of test threads.
//! Each module is one subject; `cargo test -p modelmux-llm --test llm <module>::` runs one.

mod common;

mod adapters;
mod choices;
mod constrained;
mod engine;
mod fairness;
mod families;
mod gguf_limits;
mod mechanics;
mod pause;
mod prefix_cache;
mod prompt_logprobs;
mod quantized;
mod reference;
mod templates;
mod tokenizer;
