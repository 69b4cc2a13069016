//! The `modelmux` command's pieces, as a library so they can be tested: the YAML
//! configuration, the load generator, the status table and the bare baseline server.
//! `main.rs` only parses arguments and calls these.

pub mod bench;
pub mod config;
pub mod hello;
pub mod status;

/// The error type of the command's operations.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
