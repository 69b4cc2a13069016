//! `modelmux-etcd`: the small etcd v3 client modelmux's cluster mode needs — keys read and
//! written, prefixes watched, leases granted, kept alive and revoked, the history compacted, a
//! member's status and the member list — over tonic's HTTP/2 gRPC client, in plaintext or over
//! TLS (rustls on `ring`, with a client certificate if etcd asks for one), as a user etcd
//! authenticated ([`Credentials`]: a token on every call, renewed when it expires).
//!
//! Its gRPC code is generated from etcd's protos (`proto/`, trimmed to these calls) by
//! `scripts/gen-etcd-proto` and checked in under `src/generated/`, so building it needs nothing
//! but the Rust toolchain: no `protoc`, no build script. It must never grow a build step that
//! does. Replies are the generated messages themselves ([`RangeResponse`], [`WatchResponse`],
//! ...), with etcd's own field names and documentation.
//!
//! ```no_run
//! # async fn example() -> Result<(), modelmux_etcd::Error> {
//! use modelmux_etcd::{Client, ConnectOptions};
//!
//! let client = Client::connect(["http://127.0.0.1:2379"], ConnectOptions::new()).await?;
//! let lease = client.lease_grant(3).await?.id;
//! client.put("modelmux/nodes/a", "up", Some(lease)).await?;
//! let reply = client.get_prefix("modelmux/").await?;
//! assert_eq!(reply.kvs.len(), 1);
//! client.lease_revoke(lease).await?; // and the key goes with it
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_code)]

mod auth;
mod client;
mod error;
pub mod generated;
mod kv;
mod lease;
mod members;
mod tls;
mod watch;

pub use auth::Credentials;
pub use client::{Client, ConnectOptions};
pub use error::Error;
pub use generated::etcdserverpb::{
    CompactionResponse, DeleteRangeResponse, LeaseGrantResponse, LeaseKeepAliveResponse,
    LeaseRevokeResponse, Member, MemberListResponse, PutResponse, RangeResponse, ResponseHeader,
    StatusResponse, WatchResponse,
};
pub use generated::mvccpb::event::EventType;
pub use generated::mvccpb::{Event, KeyValue};
pub use lease::{LeaseKeepAliveStream, LeaseKeeper};
pub use tls::TlsOptions;
pub use watch::{WatchOptions, WatchStream, Watcher};
