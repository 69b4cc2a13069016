//! The `modelmux` command's pieces, as a library so they can be tested: the YAML
//! configuration, the load generator, the status table, the admin token's file and client, and
//! the bare baseline server, the planner's command.
//! `main.rs` only parses arguments and calls these.

pub mod admin_client;
pub mod bench;
pub mod config;
pub mod hello;
pub mod local_admin;
pub mod logging;
pub mod plan;
pub mod status;

/// Writes `text` to stdout. Unlike `print!`, never panics: a closed stdout (`| head -1`, a
/// supervisor that stopped reading) must not crash the command.
pub fn say(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = out.write_fmt(text).and_then(|()| out.flush());
}

/// The error type of the command's operations.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;
