//! What three hand-written pieces of the server save over the well-kept libraries they stand
//! in for, each pair measured in the same run (interleaved rounds, medians), so that the day
//! upstream catches up shows as a ratio near 1: then the piece goes back to the library
//! (`docs/ARCHITECTURE.md`, "Decisions"). `scripts/bench-serve` prints these lines as its (d).
//!
//! - **stack**: an application request's way in, as `src/connection/stack.rs` writes it (a
//!   permit of the shared semaphore by `try_acquire_owned`, the route's future boxed, the
//!   request timeout), against what it was: tower's `LoadShed` over `GlobalConcurrencyLimit`
//!   over `Timeout` in a `BoxCloneService`, cloned for each request and called through
//!   `ready`, around a route that answers at once. Time and heap allocations per request.
//! - **head timeout**: HTTP/1 keep-alive requests to hyper over in-memory pipes (32 connections
//!   at once on a two-thread runtime, as `scripts/bench-serve`'s (a) has them), with hyper's
//!   own `header_read_timeout` (a timer armed for every request head), against none and the
//!   connection's watchdog (`src/connection/activity.rs`, compiled in from there: its byte
//!   counting on every read and write, its guard on every request, its look every quarter
//!   timeout). CPU per request, hyper's client included (the same on both sides).
//! - **log lines**: 160-byte lines from two threads into the log writer's bounded buffer
//!   (`crates/cli/src/logging/buffer.rs`, compiled in from there) against tracing-appender's
//!   non-blocking writer (lossy, as ours drops when full), both writing to a sink. The
//!   process's CPU per line, writer threads included.
//!
//! Run: `cargo bench -p modelmux-front --bench upstream` (`ROUNDS` rounds, default 5). Linux
//! only: CPU time is read from `/proc/self/task/*/schedstat`.

#[allow(dead_code, unreachable_pub)]
#[path = "../src/connection/activity.rs"]
mod activity;
#[allow(dead_code, unreachable_pub)]
#[path = "../../cli/src/logging/buffer.rs"]
mod buffer;

use std::alloc::System;
use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tokio::sync::Semaphore;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// CPU time of every thread of the process alive now, in nanoseconds.
fn cpu_ns() -> u64 {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task (Linux only)")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// One measurement: CPU nanoseconds and heap allocations per operation.
#[derive(Clone, Copy)]
struct Cost {
    ns: f64,
    allocations: f64,
}

/// Runs `work` (which does `n` operations) and returns its cost per operation.
fn measure(n: usize, work: impl FnOnce()) -> Cost {
    let region = Region::new(GLOBAL);
    let before = cpu_ns();
    work();
    let ns = cpu_ns().saturating_sub(before) as f64;
    Cost {
        ns: ns / n as f64,
        allocations: region.change().allocations as f64 / n as f64,
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs each side `rounds` times, alternating, and prints the medians and their ratio.
fn pair(
    what: &str,
    unit: &str,
    rounds: usize,
    upstream: (&str, &dyn Fn() -> Cost),
    ours: (&str, &dyn Fn() -> Cost),
) {
    let (mut theirs, mut mine) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        theirs.push(upstream.1());
        mine.push(ours.1());
    }
    let ns = |c: &[Cost]| median(c.iter().map(|c| c.ns).collect());
    let allocations = |c: &[Cost]| median(c.iter().map(|c| c.allocations).collect());
    let (t, m) = (ns(&theirs), ns(&mine));
    println!(
        "(d) {what:13} {:44} {t:8.0} ns/{unit} {:5.1} allocs | {:34} {m:8.0} ns/{unit} {:5.1} allocs | ours/upstream {:.2}",
        upstream.0,
        allocations(&theirs),
        ours.0,
        allocations(&mine),
        m / t,
    );
}

/// The route: answers at once.
async fn route(request: u64) -> u64 {
    std::hint::black_box(request) + 1
}

/// `stack.rs`'s `Apps::call`, in its own lines, around [`route`].
async fn ours_call(cap: &Arc<Semaphore>, limit: Duration, request: u64) -> Result<u64, BoxError> {
    let Ok(_permit) = cap.clone().try_acquire_owned() else {
        return Err("the server is at its limit".into());
    };
    let routing = Box::pin(route(request));
    Ok(tokio::time::timeout(limit, routing).await?)
}

type Tower = tower::util::BoxCloneService<u64, u64, BoxError>;

/// What `stack.rs` was: tower's layers around [`route`].
fn tower_stack(cap: Arc<Semaphore>, limit: Duration) -> Tower {
    let service = ServiceBuilder::new()
        .load_shed()
        .layer(tower::limit::GlobalConcurrencyLimitLayer::with_semaphore(
            cap,
        ))
        .timeout(limit)
        .service_fn(|request| async move { Ok::<_, Infallible>(route(request).await) });
    Tower::new(service)
}

fn stack(rounds: usize) {
    const N: usize = 200_000;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let limit = Duration::from_secs(30);
    let cap = Arc::new(Semaphore::new(1024));
    let tower = tower_stack(cap.clone(), limit);
    let upstream = || {
        measure(N, || {
            runtime.block_on(async {
                for i in 0..N as u64 {
                    // As each connection's `service_fn` did: a clone of the stack per request.
                    let mut service = tower.clone();
                    let ready = service.ready().await.unwrap();
                    std::hint::black_box(ready.call(i).await.unwrap());
                }
            });
        })
    };
    let ours = || {
        measure(N, || {
            runtime.block_on(async {
                for i in 0..N as u64 {
                    std::hint::black_box(ours_call(&cap, limit, i).await.unwrap());
                }
            });
        })
    };
    pair(
        "stack",
        "request",
        rounds,
        ("tower LoadShed+GlobalConcurrencyLimit+Timeout", &upstream),
        ("connection/stack.rs", &ours),
    );
}

/// `requests` keep-alive requests on one connection; with `hyper_timer`, hyper's own header
/// read timeout, else the watchdog's activity counting and looks, as `connection/mod.rs` runs
/// them.
async fn connection(hyper_timer: bool, requests: usize) {
    let (client, server) = tokio::io::duplex(64 << 10);
    let activity = Arc::new(activity::Activity::new());
    let watched = activity.clone();
    let service = hyper::service::service_fn(move |_request| {
        let busy = (!hyper_timer).then(|| watched.begin());
        async move {
            drop(busy);
            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                b"hello",
            ))))
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    let timeout = Duration::from_secs(10);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(hyper_timer.then_some(timeout));
    let server = tokio::spawn(async move {
        if hyper_timer {
            let _ = builder
                .serve_connection(TokioIo::new(server), service)
                .await;
            return;
        }
        let io = activity::Watched::new(server, activity.clone());
        let conn = builder.serve_connection(TokioIo::new(io), service);
        tokio::pin!(conn);
        let mut watchdog = activity::Watchdog::new(&activity, Duration::from_secs(5), timeout);
        loop {
            tokio::select! {
                _ = conn.as_mut() => return,
                () = tokio::time::sleep_until(watchdog.next_look()) => {
                    std::hint::black_box(watchdog.look(&activity));
                }
            }
        }
    });
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(client))
        .await
        .unwrap();
    let client = tokio::spawn(conn);
    for _ in 0..requests {
        let request = hyper::Request::get("/")
            .header("host", "bench")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        std::hint::black_box(response.into_body().collect().await.unwrap());
    }
    drop(sender);
    let _ = client.await;
    let _ = server.await;
}

fn head_timeout(rounds: usize) {
    // As `scripts/bench-serve`'s (a): 32 connections at once on the server's runtime.
    const CONNECTIONS: usize = 32;
    const EACH: usize = 2_000;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let runtime = &runtime;
    let run = |hyper_timer| {
        move || {
            measure(CONNECTIONS * EACH, || {
                runtime.block_on(async {
                    let connections: Vec<_> = (0..CONNECTIONS)
                        .map(|_| tokio::spawn(connection(hyper_timer, EACH)))
                        .collect();
                    for c in connections {
                        c.await.unwrap();
                    }
                });
            })
        }
    };
    pair(
        "head timeout",
        "request",
        rounds,
        ("hyper header_read_timeout", &run(true)),
        ("connection/activity.rs watchdog", &run(false)),
    );
}

/// The bytes of a log line.
const LINE: usize = 160;

/// `threads` threads writing `lines` lines each through `writer`.
fn write_lines<W: Write + Clone + Send>(writer: &W, threads: usize, lines: usize) {
    let mut line = vec![b'x'; LINE];
    line[LINE - 1] = b'\n';
    std::thread::scope(|s| {
        for _ in 0..threads {
            let mut writer = writer.clone();
            let line = &line;
            s.spawn(move || {
                for _ in 0..lines {
                    let _ = writer.write_all(line);
                }
            });
        }
    });
}

/// A sink that counts the bytes written to it.
#[derive(Clone, Default)]
struct Counted(Arc<AtomicU64>);

impl Write for Counted {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes the lines through `writer` and waits (sleeping) until `sink` has every byte not
/// `dropped`: the cost per line, the writer thread's included while it still runs.
fn lines_cost<W: Write + Clone + Send>(
    writer: &W,
    sink: &Counted,
    dropped: impl Fn() -> u64,
) -> Cost {
    const THREADS: usize = 2;
    const LINES: usize = 250_000;
    let n = THREADS * LINES;
    let region = Region::new(GLOBAL);
    let before = cpu_ns();
    write_lines(writer, THREADS, LINES);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let total = (n * LINE) as u64;
    while sink.0.load(Ordering::Relaxed) + dropped() * (LINE as u64) < total {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the writer never caught up"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let ns = cpu_ns().saturating_sub(before) as f64;
    Cost {
        ns: ns / n as f64,
        allocations: region.change().allocations as f64 / n as f64,
    }
}

fn log_lines(rounds: usize) {
    let upstream = || {
        let sink = Counted::default();
        let (writer, _guard) = tracing_appender::non_blocking(sink.clone());
        let dropped = writer.error_counter();
        lines_cost(&writer, &sink, || dropped.dropped_lines() as u64)
    };
    let ours = || {
        let sink = Counted::default();
        let (buffer, _writer) = buffer::LineBuffer::start(8 << 20, sink.clone()).unwrap();
        lines_cost(&buffer, &sink, || buffer.dropped())
    };
    pair(
        "log lines",
        "line",
        rounds,
        ("tracing-appender non_blocking", &upstream),
        ("cli logging/buffer.rs", &ours),
    );
}

fn main() {
    // `cargo bench` passes `--bench`; a filter chooses the pairs run.
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let rounds = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    if wanted("stack") {
        stack(rounds);
    }
    if wanted("head") {
        head_timeout(rounds);
    }
    if wanted("log") {
        log_lines(rounds);
    }
}
