//! `modelmux-etcd-codegen PROTO_DIR OUT_DIR`: compiles etcd's protos under `PROTO_DIR` into
//! Rust (prost messages and tonic clients, no servers) written to `OUT_DIR`, one file per proto
//! package. Run by `scripts/gen-etcd-proto`, which needs `protoc` on `PATH` (or `PROTOC`).

use std::path::PathBuf;
use std::process::ExitCode;

/// The protos to compile, relative to `PROTO_DIR` (imports resolve from there too).
const PROTOS: &[&str] = &[
    "etcd/api/etcdserverpb/rpc.proto",
    "etcd/api/mvccpb/kv.proto",
    "etcd/api/authpb/auth.proto",
];

fn main() -> ExitCode {
    let args: Vec<PathBuf> = std::env::args_os().skip(1).map(PathBuf::from).collect();
    let [proto_dir, out_dir] = args.as_slice() else {
        eprintln!("usage: modelmux-etcd-codegen PROTO_DIR OUT_DIR");
        return ExitCode::from(2);
    };
    let protos: Vec<PathBuf> = PROTOS.iter().map(|p| proto_dir.join(p)).collect();
    let generated = tonic_prost_build::configure()
        .build_server(false)
        .build_client(true)
        // The client is built on our own channel (see modelmux-etcd's client.rs), so no
        // `connect` constructors tied to tonic's transport are wanted.
        .build_transport(false)
        .emit_rerun_if_changed(false)
        .out_dir(out_dir)
        .compile_protos(&protos, std::slice::from_ref(proto_dir));
    match generated {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("generating etcd's client code: {e}");
            ExitCode::FAILURE
        }
    }
}
