//! `modelmux`: serve many models from one pool of replicas.
//!
//! ```text
//! modelmux serve [CONFIG]    run a server (no CONFIG: the built-in demo: 8 ONNX models, 2 replicas)
//! modelmux run module:app    serve a Python application (Ray's `serve run`)
//! modelmux status            show what a running server holds, per replica
//! modelmux token             print the admin token a local server wrote to its file
//! modelmux bench             load-test a running server
//! ```
//!
//! (`modelmux hello-server`, a bare hyper server that the benchmark scripts measure against,
//! is hidden from the help.)

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use modelmux_cli::admin_client::TokenFlags;
use modelmux_cli::config::{self, ClusterFlags, Config, LogFormat};
use modelmux_cli::{CliError, admin_client, bench, hello, local_admin, logging, status};
use modelmux_cluster::{ClusterNode, Role};

#[derive(Parser)]
#[command(
    name = "modelmux",
    version,
    about = "Serve many models of the same shape from one pool of replicas."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a server from a YAML configuration (without one, the built-in demo: 8 ONNX classifiers on 2 replicas).
    ///
    /// It listens on http://127.0.0.1:8000 unless the configuration's http_options or
    /// --host/--port say otherwise.
    Serve {
        /// The configuration file (relative paths in it are read from its own directory).
        config: Option<PathBuf>,
        #[command(flatten)]
        flags: ServerFlags,
        /// Only check the configuration, then exit.
        #[arg(long)]
        check: bool,
        /// Join a cluster coordinated by etcd: `etcd://h1:2379,h2:2379` (overrides cluster.etcd).
        #[arg(long, env = "MODELMUX_CLUSTER")]
        cluster: Option<String>,
        /// This node's id in the cluster (overrides cluster.node_id).
        #[arg(long, env = "MODELMUX_NODE_ID")]
        node_id: Option<String>,
        /// Where other nodes reach this one, `http://host:port` (overrides cluster.advertise).
        #[arg(long, env = "MODELMUX_ADVERTISE")]
        advertise: Option<String>,
        /// `both` (route and run replicas), `ingress` (route only) or `node` (replicas only).
        #[arg(long, env = "MODELMUX_ROLE", value_parser = parse_role)]
        role: Option<Role>,
    },
    /// Serve a Python application, as Ray's `serve run module:app`: its deployments'
    /// decorators give their settings.
    Run {
        /// The application: `module:attribute`, a bound deployment (`app = Model.bind()`).
        import_path: String,
        /// The application's name.
        #[arg(long, default_value = "default")]
        name: String,
        /// The path prefix it serves.
        #[arg(long, default_value = "/")]
        route_prefix: String,
        /// A directory to import the module from (the workers' current directory).
        #[arg(long)]
        working_dir: Option<PathBuf>,
        #[command(flatten)]
        flags: ServerFlags,
    },
    /// Apply a new configuration to a running server: deployments that did not change keep
    /// their replicas and warm models, `num_replicas` changes scale in place, other changes
    /// roll the deployment; a configuration that does not validate is refused whole.
    Deploy {
        /// The new configuration.
        config: PathBuf,
        /// Deploy to every node of the cluster whose etcd this is (`etcd://host:port,...`):
        /// its applications are written to etcd, and each node applies them.
        #[arg(long)]
        cluster: Option<String>,
        /// The cluster's name (default: the configuration's `cluster.name`, or `default`).
        #[arg(long)]
        cluster_name: Option<String>,
        /// The server.
        #[arg(long, env = "MODELMUX_URL", default_value = "http://127.0.0.1:8000")]
        url: String,
        #[command(flatten)]
        token: TokenFlags,
    },
    /// Show the models each replica of a running server holds.
    Status {
        /// The server.
        #[arg(long, env = "MODELMUX_URL", default_value = "http://127.0.0.1:8000")]
        url: String,
        #[command(flatten)]
        token: TokenFlags,
    },
    /// Print the admin token a server on loopback, started by this account without
    /// http_options.admin_token, wrote to its file (for curl, or the dashboard's login).
    Token {
        /// The server.
        #[arg(long, env = "MODELMUX_URL", default_value = "http://127.0.0.1:8000")]
        url: String,
        /// Print the file's path instead of the token.
        #[arg(long)]
        path: bool,
    },
    /// Load-test a running server.
    Bench(bench::BenchArgs),
    /// A bare hyper server answering "hello": the limit modelmux's overhead is measured against
    /// (a benchmark helper, hidden from the help).
    #[command(hide = true)]
    HelloServer {
        /// Port to listen on (127.0.0.1).
        #[arg(long, default_value_t = 8001)]
        port: u16,
    },
}

/// Where a server listens and how it logs, over what its configuration says.
#[derive(clap::Args)]
struct ServerFlags {
    /// Address to listen on; overrides http_options.host [default: 127.0.0.1].
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on; overrides http_options.port [default: 8000].
    #[arg(long)]
    port: Option<u16>,
    /// Overrides logging.format.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Overrides logging.level (a tracing filter, such as `info,modelmux::access=warn`).
    #[arg(long)]
    log_level: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve {
                config,
                flags: server,
                check,
                cluster,
                node_id,
                advertise,
                role,
            } => {
                let flags = ClusterFlags {
                    etcd: cluster,
                    node_id,
                    advertise,
                    role,
                };
                let source = match config {
                    Some(path) => Source::File(path),
                    None => Source::Demo,
                };
                serve(source, server, flags, check).await
            }
            Command::Run {
                import_path,
                name,
                route_prefix,
                working_dir,
                flags,
            } => {
                let mut app = serde_json::json!({
                    "name": name,
                    "route_prefix": route_prefix,
                    "import_path": import_path,
                });
                if let Some(dir) = working_dir {
                    app["runtime_env"] = serde_json::json!({"working_dir": dir});
                }
                let text = serde_json::json!({"applications": [app]}).to_string();
                let source = Source::Text(text, format!("`run {import_path}`"));
                serve(source, flags, ClusterFlags::default(), false).await
            }
            Command::Status { url, token } => {
                status::run(&url, token.resolve(&url)?.as_ref()).await
            }
            Command::Token { url, path } => {
                let (file, token) = admin_client::local_token(&url)?;
                say(format_args!(
                    "{}",
                    if path {
                        file.display().to_string()
                    } else {
                        token
                    }
                ));
                Ok(())
            }
            Command::Deploy {
                config,
                cluster: Some(etcd),
                cluster_name,
                ..
            } => deploy_to_cluster(&config, &etcd, cluster_name).await,
            Command::Deploy {
                config, url, token, ..
            } => status::deploy(&url, token.resolve(&url)?.as_ref(), &config).await,
            Command::Bench(args) => bench::run(args).await,
            Command::HelloServer { port } => hello::run(port).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_role(value: &str) -> Result<Role, String> {
    match value {
        "both" => Ok(Role::Both),
        "ingress" => Ok(Role::Ingress),
        "node" => Ok(Role::Node),
        other => Err(format!("{other:?}: expected both, ingress or node")),
    }
}

/// Where `serve` gets its configuration.
enum Source {
    /// A YAML file.
    File(PathBuf),
    /// The built-in demo.
    Demo,
    /// A configuration made from the command line, and what to call it in messages.
    Text(String, String),
}

async fn serve(
    source: Source,
    ServerFlags {
        host,
        port,
        log_format,
        log_level,
    }: ServerFlags,
    flags: ClusterFlags,
    check: bool,
) -> Result<(), CliError> {
    let path = match &source {
        Source::File(p) => Some(p.clone()),
        _ => None,
    };
    let demo = matches!(source, Source::Demo);
    let (text, source) = match source {
        Source::File(p) => (
            std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
            p.display().to_string(),
        ),
        Source::Demo => (config::DEMO.to_string(), "the built-in demo".to_string()),
        Source::Text(text, source) => (text, source),
    };
    let mut config = Config::parse(&text).map_err(|e| format!("{source}: {e}"))?;
    if let Some(p) = &path {
        let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
        config.resolve_paths(dir.unwrap_or(std::path::Path::new(".")));
    }
    if let Some(host) = host {
        config.http_options.host = host;
    }
    if let Some(port) = port {
        config.http_options.port = port;
    }
    if config.http_options.admin_token.is_none() {
        config.http_options.admin_token = std::env::var("MODELMUX_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.is_empty());
    }
    let listen = config
        .bind_address()
        .map_err(|e| format!("{source}: {e}"))?;
    // No token and on loopback: one made now, in a file only this account reads.
    let local_token = if check {
        None
    } else {
        local_admin::LocalToken::plan(&mut config.http_options, listen)?
    };
    let cluster = config
        .cluster
        .options(&flags, listen)
        .map_err(|e| format!("{source}: {e}"))?;
    if check {
        config.check().await.map_err(|e| format!("{source}: {e}"))?;
        say(format_args!("{source}: configuration is valid"));
        return Ok(());
    }
    let (mut builder, disk_cache) = config
        .server_and_cache()
        .await
        .map_err(|e| format!("{source}: {e}"))?;
    // `modelmux deploy`, `POST /-/deploy` and SIGHUP change this running configuration.
    let base_dir = path
        .as_deref()
        .and_then(|p| p.parent())
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    let reloader = std::sync::Arc::new(config::Reloader::new(
        text.clone(),
        base_dir,
        disk_cache,
        config.http_options.admin(),
    ));
    builder = builder.deployer(reloader.clone());
    if let Some(cluster) = &cluster {
        builder = builder.node_id(&cluster.node_id);
        if !cluster.role.runs_replicas() {
            builder = builder.router_only();
        }
    }
    let log = logging::init(
        log_format.unwrap_or(config.logging.format),
        log_level.as_deref().or(config.logging.level.as_deref()),
        config.logging.max_buffered_bytes,
    )
    .map_err(|e| format!("cannot start the log writer: {e}"))?;
    let (format, access) = log.access_sink();
    builder = builder
        .metrics_source(log.metrics())
        .access_log(format, access);
    if let Some(local) = &local_token {
        builder = builder.on_listening(local.writer());
    }
    // Listen for signals before announcing readiness: a SIGTERM sent right after the "serving"
    // line must stop the server gracefully, not kill it.
    let stop = shutdown_signal();
    let server = builder.start().await?;
    reloader.attach(server.controller());
    if let Some(path) = path.clone() {
        tokio::spawn(reload_on_hangup(path, reloader.clone()));
    }
    let addr = server.local_addr();
    let member = match cluster {
        Some(mut options) => {
            // Every node applies what `modelmux deploy --cluster` writes to etcd.
            let (endpoints, prefix) = (options.endpoints.clone(), options.prefix.clone());
            let security = options.etcd_security.clone();
            let follower = reloader.clone();
            tokio::spawn(async move {
                let client = match modelmux_cluster::connect_with(&endpoints, &security).await {
                    Ok(client) => client,
                    Err(e) => return tracing::error!("following the cluster's configuration: {e}"),
                };
                let applied = modelmux_cluster::follow_config(client, &prefix, |text| {
                    let follower = follower.clone();
                    async move {
                        match follower.apply_applications(&text).await {
                            Ok(answer) => {
                                tracing::info!(%answer, "applied the cluster's configuration")
                            }
                            Err(e) => tracing::error!("the cluster's configuration: {e}"),
                        }
                    }
                })
                .await;
                if let Err(e) = applied {
                    tracing::error!("following the cluster's configuration: {e}");
                }
            });
            // Advertised as the address it listens on: now with the port it really got.
            if options.advertise == format!("http://{listen}") {
                options.advertise = format!("http://{addr}");
            }
            let (node, role) = (options.node_id.clone(), options.role);
            let joined = ClusterNode::join(options, server.node_handle()).await;
            match joined {
                Ok(member) => {
                    tracing::info!(%node, ?role, "joined the cluster");
                    Some(member)
                }
                Err(e) => {
                    server.shutdown().await;
                    return Err(format!("joining the cluster: {e}").into());
                }
            }
        }
        None => None,
    };
    say(format_args!("modelmux serving {source} on http://{addr}"));
    if let Some(path) = local_token.as_ref().and_then(|t| t.path()) {
        say(format_args!(
            "admin token in {} (modelmux status, deploy and token read it; \
             http_options.trust_local_users: true turns it off)",
            path.display()
        ));
    }
    if demo {
        say(format_args!(
            "try: curl -H 'serve_multiplexed_model_id: customer-1' -d '{{\"inputs\": [[0.5, -1.2, 3.3, 0.1]]}}' http://{addr}/"
        ));
    }
    stop.await;
    say(format_args!(
        "shutting down: finishing requests in flight, then unloading models"
    ));
    // Readiness fails and the node's replicas are published unavailable at once (other nodes
    // stop sending it requests); in-flight work finishes; then its records leave etcd.
    server.shutdown().await;
    if let Some(member) = member {
        if let Err(e) = member.leave().await {
            tracing::warn!("leaving the cluster: {e}");
        }
    }
    let dropped = log.dropped_lines();
    if dropped > 0 {
        tracing::warn!("{dropped} log lines were dropped: stderr was not read fast enough");
    }
    // The token file goes with the server.
    drop(local_token);
    // The log's writer thread writes what is still buffered, then stops.
    drop(log);
    Ok(())
}

/// Prints a line for the operator, never panicking on a closed stdout.
fn say(line: std::fmt::Arguments<'_>) {
    modelmux_cli::say(format_args!("{line}\n"));
}

/// Registers for SIGTERM (what Kubernetes and systemd send) and SIGINT (Ctrl-C) now, so no
/// signal is missed; the returned future completes at the first of them.
/// `modelmux deploy FILE --cluster ETCD`: writes the configuration where every node of the
/// cluster follows it.
async fn deploy_to_cluster(
    path: &std::path::Path,
    etcd: &str,
    name: Option<String>,
) -> Result<(), CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut config = Config::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let name = name
        .or(config.cluster.name.clone())
        .unwrap_or_else(|| "default".into());
    let endpoints = modelmux_cluster::parse_endpoints(etcd)?;
    let prefix = format!("modelmux/{name}");
    // etcd is reached as the file's `cluster.etcd_tls` and `etcd_auth` say.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    config.resolve_paths(dir.unwrap_or(std::path::Path::new(".")));
    let security = config
        .cluster
        .etcd_security()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    modelmux_cluster::publish_config(&endpoints, &security, &prefix, &text)
        .await
        .map_err(|e| format!("writing to etcd at {etcd}: {e}"))?;
    say(format_args!(
        "deployed {} to cluster '{name}': every node applies it",
        path.display()
    ));
    Ok(())
}

/// Re-reads `path` and applies it on every SIGHUP (as `modelmux deploy` would).
async fn reload_on_hangup(path: PathBuf, reloader: std::sync::Arc<config::Reloader>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            return;
        };
        while hangups.recv().await.is_some() {
            let text = match std::fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) => {
                    tracing::error!("SIGHUP: cannot read {}: {e}", path.display());
                    continue;
                }
            };
            match reloader.apply(&text).await {
                Ok(answer) => tracing::info!(%answer, "SIGHUP: applied {}", path.display()),
                Err(e) => tracing::error!("SIGHUP: {}: {e}", path.display()),
            }
        }
    }
}

fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        );
        async move {
            match streams {
                (Ok(mut term), Ok(mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
