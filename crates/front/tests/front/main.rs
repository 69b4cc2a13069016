//! The front door's integration tests, in one binary (one link, the helpers compiled once,
//! one pool of test threads); `cargo test -p modelmux-front --test front <module>::` runs one.

mod common;

mod access_log;
mod admin_access;
mod copies;
mod dashboard;
mod front_door;
mod fuzz_admin;
mod hostile;
mod http;
mod queue;
mod resume;
mod startup;
mod streaming;
