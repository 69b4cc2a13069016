//! `modelmux bench`: a closed-loop load generator.
//!
//! `--concurrency` connections (HTTP/1.1 keep-alive) each send one request at a time for
//! `--duration` seconds. Request `i` names model `ids[k]`, where `k` is drawn from a uniform
//! or Zipf(`--zipf`) popularity by a function of `(seed, i)` alone, so the sequence is
//! reproducible: `--lru-slots K` replays the same sequence through an offline global K-slot
//! LRU, the yardstick for how many loads a multiplexed fleet should need, and through Belady's
//! optimal K-slot cache, the fewest loads any policy could do. Server-side loads,
//! evictions and hits are read from `/metrics` before and after.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::CliError;

mod workload;

use workload::Popularity;
pub use workload::{lru_loads, optimal_loads};

/// Prints a line without panicking on a closed stdout.
macro_rules! out {
    ($($t:tt)*) => {
        crate::say(format_args!("{}\n", format_args!($($t)*)))
    };
}

/// Arguments of `modelmux bench`.
#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// The server (http://host:port).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    url: String,
    /// Path to request.
    #[arg(long, default_value = "/")]
    path: String,
    /// Distinct model ids (`<prefix><n>`); 0 sends no model header.
    #[arg(long, default_value_t = 1)]
    models: usize,
    /// Prefix of the model ids.
    #[arg(long, default_value = "")]
    model_prefix: String,
    /// Number of the first model id (`--first-model 1 --model-prefix customer-` asks for
    /// customer-1, customer-2, ...).
    #[arg(long, default_value_t = 0)]
    first_model: usize,
    /// Zipf exponent of model popularity; 0 is uniform.
    #[arg(long, default_value_t = 0.0)]
    zipf: f64,
    /// Connections, each with one request in flight.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seed of the request sequence.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Also replay the sequence through an offline global LRU with this many slots.
    #[arg(long)]
    lru_slots: Option<usize>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Send this body with each request (a POST); without it, requests are GETs.
    #[arg(long)]
    body: Option<String>,
    /// Seconds one request may take before it counts as a timeout.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Where the server-side loads, evictions and hits are read (`/metrics`), summed; repeat it
    /// for every node of a cluster, whose loads happen on the nodes, not on the ingress
    /// `--url` names. Default: `--url`.
    #[arg(long = "metrics-url")]
    metrics_urls: Vec<String>,
}

pub(crate) fn parse_url(url: &str) -> Result<SocketAddr, CliError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or("only http:// URLs are supported")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority.replace("localhost", "127.0.0.1");
    Ok(authority
        .parse()
        .map_err(|e| format!("'{authority}' is not host:port ({e})"))?)
}

/// `GET {url}{path}` (with the bearer `token`): the status and body.
pub async fn http_get(
    url: &str,
    path: &str,
    token: Option<&str>,
) -> Result<(u16, Bytes), CliError> {
    send(url, hyper::Request::get(path), token, Bytes::new()).await
}

/// `POST {url}{path}` with `body` as JSON (and the bearer `token`): the status and body.
pub async fn http_post_json(
    url: &str,
    path: &str,
    token: Option<&str>,
    body: &serde_json::Value,
) -> Result<(u16, Bytes), CliError> {
    let bytes = Bytes::from(serde_json::to_vec(body).map_err(|e| e.to_string())?);
    let request = hyper::Request::post(path).header("content-type", "application/json");
    send(url, request, token, bytes).await
}

/// Sends `request` with `body` to the server at `url` on a new connection.
async fn send(
    url: &str,
    request: http::request::Builder,
    token: Option<&str>,
    body: Bytes,
) -> Result<(u16, Bytes), CliError> {
    let addr = parse_url(url)?;
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut request = request.header("host", addr.to_string());
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let response = sender.send_request(request.body(Full::new(body))?).await?;
    let status = response.status().as_u16();
    Ok((status, response.into_body().collect().await?.to_bytes()))
}

/// Sums every series of each named metric in a Prometheus text page; `None` if the page is not
/// of the text format.
fn metric_sums(page: &str, names: &[&str]) -> Option<Vec<f64>> {
    let page = modelmux_promtext::parse(page).ok()?;
    Some(names.iter().map(|name| page.sum(name)).collect())
}

const SERVER_METRICS: [&str; 4] = [
    "modelmux_model_loads_total",
    "modelmux_model_evictions_total",
    "modelmux_cache_hits_total",
    "modelmux_cache_misses_total",
];

/// The server metrics summed over `urls`; `None` if one cannot be read.
async fn scrape(urls: &[String]) -> Option<Vec<f64>> {
    let mut sums = vec![0.0; SERVER_METRICS.len()];
    for url in urls {
        let (status, body) = http_get(url, "/metrics", None).await.ok()?;
        if status != 200 {
            return None;
        }
        let page = metric_sums(&String::from_utf8_lossy(&body), &SERVER_METRICS)?;
        for (sum, value) in sums.iter_mut().zip(page) {
            *sum += value;
        }
    }
    Some(sums)
}

struct Totals {
    latency: Histogram<u64>,
    /// Responses that were not 2xx (or whose body failed).
    failed: u64,
    /// Connections refused or broken, and requests that timed out.
    transport_errors: u64,
}

/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

async fn connect(addr: SocketAddr) -> Option<http1::SendRequest<Full<Bytes>>> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .ok()?
        .ok()?;
    let _ = stream.set_nodelay(true);
    let (sender, conn) = http1::handshake(TokioIo::new(stream)).await.ok()?;
    tokio::spawn(conn);
    Some(sender)
}

fn request_for(
    args: &BenchArgs,
    host: &str,
    model: Option<usize>,
) -> Result<hyper::Request<Full<Bytes>>, CliError> {
    let method = if args.body.is_some() { "POST" } else { "GET" };
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(args.path.as_str())
        .header("host", host);
    if let Some(k) = model {
        request = request.header(
            "serve_multiplexed_model_id",
            format!("{}{}", args.model_prefix, args.first_model + k),
        );
    }
    let body = args.body.clone().map(Bytes::from).unwrap_or_default();
    Ok(request.body(Full::new(body))?)
}

async fn worker(
    addr: SocketAddr,
    args: Arc<BenchArgs>,
    popularity: Arc<Popularity>,
    next: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Totals {
    let mut totals = Totals {
        latency: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
        failed: 0,
        transport_errors: 0,
    };
    let host = addr.to_string();
    let timeout = Duration::from_secs_f64(args.timeout);
    while !stop.load(Ordering::Relaxed) {
        let Some(mut sender) = connect(addr).await else {
            totals.transport_errors += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        // One request at a time on this connection, for as long as it stays usable.
        while !stop.load(Ordering::Relaxed) && sender.ready().await.is_ok() {
            // The index is taken only when the request can go out, so the offline replay
            // sees exactly the requests sent.
            let i = next.fetch_add(1, Ordering::Relaxed);
            let model = (args.models > 0).then(|| popularity.model_for(i));
            let Ok(request) = request_for(&args, &host, model) else {
                unreachable!("checked before the workers started")
            };
            let start = Instant::now();
            let exchange = async {
                let response = sender.send_request(request).await?;
                let success = response.status().is_success();
                // The body is always read, so the connection can carry the next request.
                response.into_body().collect().await?;
                Ok::<_, hyper::Error>(success)
            };
            match tokio::time::timeout(timeout, exchange).await {
                Ok(Ok(success)) => {
                    let micros = u64::try_from(start.elapsed().as_micros())
                        .unwrap_or(u64::MAX)
                        .max(1);
                    let _ = totals.latency.record(micros.min(60_000_000));
                    if !success {
                        totals.failed += 1;
                    }
                }
                // Broken connection or timeout: count it, open a new connection.
                Ok(Err(_)) | Err(_) => {
                    totals.transport_errors += 1;
                    break;
                }
            }
        }
    }
    totals
}

/// Refuses arguments the run cannot use, before any request is sent.
fn check_args(args: &BenchArgs) -> Result<(), CliError> {
    if args.concurrency == 0 || !(args.duration.is_finite() && args.duration > 0.0) {
        return Err("--concurrency and --duration must be positive".into());
    }
    if !(args.timeout.is_finite() && args.timeout > 0.0) {
        return Err("--timeout must be a positive number of seconds".into());
    }
    if !(args.zipf.is_finite() && args.zipf >= 0.0) {
        return Err("--zipf must be a number of at least 0 (0 is uniform)".into());
    }
    if args.lru_slots == Some(0) {
        return Err("--lru-slots must be at least 1".into());
    }
    // A request that cannot be built (a path with a space, a prefix with a control character)
    // is refused here, not in a loop in every worker.
    request_for(args, "check", (args.models > 0).then_some(0))
        .map_err(|e| format!("cannot build a request from --path and --model-prefix: {e}"))?;
    Ok(())
}

/// Waits for the workers until `deadline` (one still stuck after it is abandoned, its
/// in-flight request counted as a transport error): their latencies merged, failures and
/// transport errors summed.
async fn join_workers(
    workers: Vec<tokio::task::JoinHandle<Totals>>,
    deadline: Instant,
) -> Result<(Histogram<u64>, u64, u64), CliError> {
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut failed, mut transport_errors) = (0, 0);
    for w in workers {
        let abort = w.abort_handle();
        match tokio::time::timeout_at(deadline, w).await {
            Ok(t) => {
                let t = t?;
                latency
                    .add(&t.latency)
                    .map_err(|e| format!("merging histograms: {e}"))?;
                failed += t.failed;
                transport_errors += t.transport_errors;
            }
            Err(_) => {
                abort.abort();
                transport_errors += 1;
            }
        }
    }
    Ok((latency, failed, transport_errors))
}

/// The report as text: requests, latency, the server's cache counters, the offline LRU and
/// optimal figures.
fn print_report(report: &serde_json::Value, latency: &Histogram<u64>, elapsed: f64) {
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    let (completed, failed, transport_errors) = (
        latency.len(),
        report["failed"].as_u64().unwrap_or(0),
        report["transport_errors"].as_u64().unwrap_or(0),
    );
    out!(
        "requests    {completed} answered ({failed} not 2xx), {transport_errors} connection errors or timeouts, {elapsed:.1} s, {:.0} req/s",
        completed as f64 / elapsed
    );
    out!(
        "latency ms  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(0.999),
        latency.max() as f64 / 1000.0
    );
    if let Some(s) = &report["server"].as_object() {
        out!(
            "server      loads {}  evictions {}  hits {}  misses {}  hit ratio {:.2}%  loads/10k requests {:.1}",
            s["loads"],
            s["evictions"],
            s["hits"],
            s["misses"],
            s["hit_ratio"].as_f64().unwrap_or(0.0) * 100.0,
            s["loads_per_10k_requests"].as_f64().unwrap_or(0.0)
        );
    }
    for (key, name) in [
        ("global_lru", "global LRU"),
        ("global_optimal", "optimal   "),
    ] {
        if let Some(g) = &report[key].as_object() {
            out!(
                "{name}  {} slots, same {} requests offline: loads {}  hit ratio {:.2}%  loads/10k requests {:.1}",
                g["slots"],
                g["requests"],
                g["loads"],
                g["hit_ratio"].as_f64().unwrap_or(0.0) * 100.0,
                g["loads_per_10k_requests"].as_f64().unwrap_or(0.0)
            );
        }
    }
}

/// Runs the benchmark and prints its report.
pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    let addr = parse_url(&args.url)?;
    check_args(&args)?;
    let popularity = Arc::new(Popularity::new(args.models.max(1), args.zipf, args.seed));
    let metrics_urls = if args.metrics_urls.is_empty() {
        vec![args.url.clone()]
    } else {
        args.metrics_urls.clone()
    };
    let before = scrape(&metrics_urls).await;
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let args = Arc::new(args);
    let start = Instant::now();
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| {
            tokio::spawn(worker(
                addr,
                args.clone(),
                popularity.clone(),
                next.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(args.duration)).await;
    stop.store(true, Ordering::Relaxed);
    // Requests in flight get their timeout to finish; a worker still stuck after that is
    // abandoned (and its in-flight request counted as a transport error).
    let deadline = Instant::now() + Duration::from_secs_f64(args.timeout) + CONNECT_TIMEOUT;
    let (latency, failed, transport_errors) = join_workers(workers, deadline).await?;
    let elapsed = start.elapsed().as_secs_f64();
    let after = scrape(&metrics_urls).await;
    let sent = next.load(Ordering::Relaxed);
    let completed = latency.len();
    let ms = |q: f64| latency.value_at_quantile(q) as f64 / 1000.0;
    // A counter that went down means the server (or a replica) restarted: no trustworthy delta.
    let server = before
        .zip(after)
        .filter(|(b, a)| a.iter().zip(b).all(|(a, b)| a >= b))
        .map(|(b, a)| a.iter().zip(&b).map(|(a, b)| a - b).collect::<Vec<_>>());
    let simulated = args.lru_slots.filter(|_| args.models > 0).map(|slots| {
        let sequence: Vec<usize> = (0..sent).map(|i| popularity.model_for(i)).collect();
        (
            slots,
            lru_loads(sequence.iter().copied(), slots),
            optimal_loads(&sequence, slots),
        )
    });
    let offline = |slots: usize, loads: u64| {
        serde_json::json!({
            "slots": slots, "loads": loads, "requests": sent,
            "hit_ratio": 1.0 - loads as f64 / (sent as f64).max(1.0),
            "loads_per_10k_requests": loads as f64 * 10_000.0 / (sent as f64).max(1.0),
        })
    };

    let report = serde_json::json!({
        "requests": completed,
        "failed": failed,
        "transport_errors": transport_errors,
        "errors": failed + transport_errors,
        "seconds": elapsed,
        "requests_per_second": completed as f64 / elapsed,
        "latency_ms": {"p50": ms(0.5), "p90": ms(0.9), "p99": ms(0.99), "p99_9": ms(0.999), "max": latency.max() as f64 / 1000.0},
        "server": server.as_ref().map(|d| serde_json::json!({
            "loads": d[0], "evictions": d[1], "hits": d[2], "misses": d[3],
            // Comparable with the global LRU's: requests that needed no load of their own.
            "hit_ratio": 1.0 - d[0] / (completed as f64).max(1.0),
            "cache_get_hit_ratio": d[2] / (d[2] + d[3]).max(1.0),
            "loads_per_10k_requests": d[0] * 10_000.0 / (completed as f64).max(1.0),
        })),
        "global_lru": simulated.map(|(slots, lru, _)| offline(slots, lru)),
        "global_optimal": simulated.map(|(slots, _, opt)| offline(slots, opt)),
    });
    if completed == 0 {
        return Err(format!(
            "no request completed in {elapsed:.1} s ({transport_errors} connection errors or timeouts): is the server at {} up?",
            args.url
        )
        .into());
    }
    if args.json {
        crate::say(format_args!("{report}\n"));
        return Ok(());
    }
    print_report(&report, &latency, elapsed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_prefers_low_ranks_and_is_reproducible() {
        let p = Popularity::new(64, 1.1, 7);
        let counts = (0..20_000).fold(vec![0u32; 64], |mut c, i| {
            c[p.model_for(i)] += 1;
            c
        });
        assert!(
            counts[0] > counts[10] && counts[10] > counts[63],
            "{counts:?}"
        );
        assert_eq!(p.model_for(123), Popularity::new(64, 1.1, 7).model_for(123));
        let uniform = Popularity::new(4, 0.0, 1);
        let u = (0..20_000).fold(vec![0u32; 4], |mut c, i| {
            c[uniform.model_for(i)] += 1;
            c
        });
        assert!(u.iter().all(|&n| (4000..6000).contains(&n)), "{u:?}");
    }

    #[test]
    fn the_offline_lru_counts_misses() {
        assert_eq!(lru_loads([1, 2, 1, 3, 2], 2), 4);
        assert_eq!(lru_loads([1, 1, 1], 1), 1);
    }

    #[test]
    fn the_offline_optimum_evicts_the_model_wanted_last() {
        // LRU evicts 2 for 3 and loads it again; the optimum evicts 1, never asked for again.
        assert_eq!(optimal_loads(&[1, 2, 1, 3, 2], 2), 3);
        assert_eq!(optimal_loads(&[1, 2, 3, 1, 2, 3], 2), 4);
        let p = Popularity::new(64, 1.1, 3);
        let sequence: Vec<usize> = (0..5_000).map(|i| p.model_for(i)).collect();
        for slots in [1, 4, 16, 64] {
            let (opt, lru) = (
                optimal_loads(&sequence, slots),
                lru_loads(sequence.iter().copied(), slots),
            );
            assert!(opt <= lru, "{slots} slots: optimum {opt} > LRU {lru}");
        }
        // Room for every model: both load each distinct model once.
        assert_eq!(optimal_loads(&sequence, 64), lru_loads(sequence, 64));
    }

    #[test]
    fn metric_sums_add_every_series_of_a_name_only() {
        let page = "# HELP a x\na_total{r=\"1\"} 2\na_total{r=\"2 } x\"} 3 1700000000\na_total_other 100\nb 1\n";
        assert_eq!(metric_sums(page, &["a_total", "b"]), Some(vec![5.0, 1.0]));
        assert_eq!(metric_sums("a_total{r=\"1\" 2\n", &["a_total"]), None);
    }
}
