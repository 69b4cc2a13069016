//! `modelmux`: serve many models from one pool of replicas.
//!
//! ```text
//! modelmux serve [CONFIG]    run a server (no CONFIG: the built-in demo: 8 ONNX models, 2 replicas)
//! modelmux run module:app    serve a Python application (Ray's `serve run`)
//! modelmux status            show what a running server holds, per replica
//! modelmux token             print the admin token a local server wrote to its file
//! modelmux bench             load-test a running server
//! modelmux plan TRACE        replay a trace in virtual time: which setting meets a target
//! ```
//!
//! (`modelmux hello-server`, a bare hyper server that the benchmark scripts measure against,
//! is hidden from the help.)

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use modelmux_cli::admin_client::TokenFlags;
use modelmux_cli::config::cluster::{self, Role};
use modelmux_cli::config::{self, ClusterFlags, Config, LogFormat};
use modelmux_cli::{CliError, admin_client, bench, hello, local_admin, logging, plan, status};

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
        #[arg(long, env = "MODELMUX_ROLE", value_parser = cluster::parse_role)]
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
    /// Replay a trace (an access log, a CSV or JSON lines) through the server's own router
    /// and caches in virtual time: the hit ratio, loads, waits and copies of a setting, or
    /// the cheapest setting of a grid that meets --target-p99-ms and --min-hit-ratio.
    Plan(plan::PlanArgs),
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
    // The planner runs its replays on runtimes of its own (paused clocks), not in this one.
    if let Command::Plan(args) = &cli.command {
        return match plan::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
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
            } => cluster::deploy(&config, &etcd, cluster_name).await,
            Command::Deploy {
                config, url, token, ..
            } => status::deploy(&url, token.resolve(&url)?.as_ref(), &config).await,
            Command::Bench(args) => bench::run(args).await,
            Command::Plan(_) => unreachable!("run above, outside the runtime"),
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

/// Where `serve` gets its configuration.
enum Source {
    /// A YAML file.
    File(PathBuf),
    /// The built-in demo.
    Demo,
    /// A configuration made from the command line, and what to call it in messages.
    Text(String, String),
}

/// The configuration `serve` runs, and where it came from.
struct Loaded {
    config: Config,
    /// Its text, which live reloads start from.
    text: String,
    /// What to call it in messages.
    source: String,
    /// Its file, if it has one.
    path: Option<PathBuf>,
    demo: bool,
}

/// Reads and parses `source`, resolves its paths against its file's folder, and applies the
/// command line's `host` and `port` and `MODELMUX_ADMIN_TOKEN`.
fn load(source: Source, host: Option<String>, port: Option<u16>) -> Result<Loaded, CliError> {
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
    Ok(Loaded {
        config,
        text,
        source,
        path,
        demo,
    })
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
    let Loaded {
        mut config,
        text,
        source,
        path,
        demo,
    } = load(source, host, port)?;
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
    if let Some(options) = &cluster {
        builder = cluster::node_settings(options, builder);
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
        Some(options) => match cluster::join(options, &server, reloader.clone(), listen).await {
            Ok(member) => Some(member),
            Err(e) => {
                server.shutdown().await;
                return Err(e.into());
            }
        },
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
        cluster::leave(member).await;
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

/// Registers for SIGTERM (what Kubernetes and systemd send) and SIGINT (Ctrl-C) now, so no
/// signal is missed; the returned future completes at the first of them.
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
