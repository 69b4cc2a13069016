//! `modelmux`: serve many models from one pool of replicas.
//!
//! ```text
//! modelmux serve [CONFIG]    run a server (no CONFIG: the built-in demo: 8 ONNX models, 2 replicas)
//! modelmux status            show what a running server holds, per replica
//! modelmux bench             load-test a running server
//! modelmux hello-server      a bare hyper server, the baseline for benchmarks
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use modelmux_cli::config::{self, Config, LogFormat};
use modelmux_cli::{CliError, bench, hello, status};

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
    Serve {
        /// The configuration file.
        config: Option<PathBuf>,
        /// Overrides http_options.host.
        #[arg(long)]
        host: Option<String>,
        /// Overrides http_options.port.
        #[arg(long)]
        port: Option<u16>,
        /// Overrides logging.format.
        #[arg(long, value_enum)]
        log_format: Option<LogFormat>,
        /// Overrides logging.level (a tracing filter, such as `info,modelmux::access=warn`).
        #[arg(long)]
        log_level: Option<String>,
        /// Only check the configuration, then exit.
        #[arg(long)]
        check: bool,
    },
    /// Show the models each replica of a running server holds.
    Status {
        /// The server.
        #[arg(long, default_value = "http://127.0.0.1:8000")]
        url: String,
        /// Admin bearer token, if the server requires one.
        #[arg(long, env = "MODELMUX_ADMIN_TOKEN")]
        token: Option<String>,
    },
    /// Load-test a running server.
    Bench(bench::BenchArgs),
    /// A bare hyper server answering "hello": the limit modelmux's overhead is measured against.
    HelloServer {
        /// Port to listen on (127.0.0.1).
        #[arg(long, default_value_t = 8001)]
        port: u16,
    },
}

/// Sets up logging. An explicit level (flag or config) wins over `RUST_LOG`, which is used
/// only when neither says anything.
fn init_logging(format: LogFormat, level: Option<&str>) {
    let filter = match level {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
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
                host,
                port,
                log_format,
                log_level,
                check,
            } => serve(config, host, port, log_format, log_level, check).await,
            Command::Status { url, token } => status::run(&url, token.as_deref()).await,
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

async fn serve(
    path: Option<PathBuf>,
    host: Option<String>,
    port: Option<u16>,
    log_format: Option<LogFormat>,
    log_level: Option<String>,
    check: bool,
) -> Result<(), CliError> {
    let (text, source) = match &path {
        Some(p) => (
            std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?,
            p.display().to_string(),
        ),
        None => (config::DEMO.to_string(), "the built-in demo".to_string()),
    };
    let mut config = Config::parse(&text).map_err(|e| format!("{source}: {e}"))?;
    if let Some(host) = host {
        config.http_options.host = host;
    }
    if let Some(port) = port {
        config.http_options.port = port;
    }
    if check {
        config.check().await.map_err(|e| format!("{source}: {e}"))?;
        say(format_args!("{source}: configuration is valid"));
        return Ok(());
    }
    let builder = config
        .server()
        .await
        .map_err(|e| format!("{source}: {e}"))?;
    init_logging(
        log_format.unwrap_or(config.logging.format),
        log_level.as_deref().or(config.logging.level.as_deref()),
    );
    // Listen for signals before announcing readiness: a SIGTERM sent right after the "serving"
    // line must stop the server gracefully, not kill it.
    let stop = shutdown_signal();
    let server = builder.start().await?;
    let addr = server.local_addr();
    say(format_args!("modelmux serving {source} on http://{addr}"));
    if path.is_none() {
        say(format_args!(
            "try: curl -H 'serve_multiplexed_model_id: customer-1' -d '{{\"inputs\": [[0.5, -1.2, 3.3, 0.1]]}}' http://{addr}/"
        ));
    }
    stop.await;
    say(format_args!(
        "shutting down: finishing requests in flight, then unloading models"
    ));
    server.shutdown().await;
    Ok(())
}

/// Prints a line for the operator, never panicking on a closed stdout.
fn say(line: std::fmt::Arguments<'_>) {
    modelmux_cli::say(format_args!("{line}\n"));
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
