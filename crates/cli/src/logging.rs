//! The server's log: lines formatted on the task that logs them and written to stderr by a
//! background thread, so a request never waits for a write (an access line per request, a
//! slow or full stderr pipe).
//!
//! The buffer between them is bounded: when it is full (stderr is not being read fast enough)
//! a line is dropped and counted, never waited for. The count is the metric
//! `modelmux_log_lines_dropped_total`. tracing-appender's non-blocking writer does this; the
//! writer it drains into is buffered, so a burst of lines costs one `write` per batch, not
//! one per line.

use std::io::{BufWriter, IsTerminal, Write};
use std::sync::Arc;

use modelmux_front::{AccessFormat, AccessSink};
use modelmux_serve::{MetricFamily, MetricKind, MetricValue, MetricsSource};
use tracing_appender::non_blocking::{ErrorCounter, NonBlocking, NonBlockingBuilder, WorkerGuard};

use crate::config::LogFormat;

/// Lines the log buffers for its writer by default (a few MiB at typical line lengths).
pub const DEFAULT_BUFFERED_LINES: usize = 32 * 1024;

/// The log writer's handle: keeps its thread running (lines still buffered are written when
/// it drops) and reports the lines it dropped.
#[must_use = "dropping it stops the log writer"]
pub struct Log {
    _writer: WorkerGuard,
    dropped: ErrorCounter,
    lines: NonBlocking,
    format: LogFormat,
}

impl Log {
    /// Lines dropped so far because the buffer was full.
    pub fn dropped_lines(&self) -> usize {
        self.dropped.dropped_lines()
    }

    /// Where the server writes its access lines: the same bounded queue and writer, in the
    /// log's format, formatted by the server itself (faster than a `tracing` event).
    pub fn access_sink(&self) -> (AccessFormat, Arc<dyn AccessSink>) {
        let format = match self.format {
            LogFormat::Text => AccessFormat::Text,
            LogFormat::Json => AccessFormat::Json,
        };
        (format, Arc::new(Lines(self.lines.clone())))
    }

    /// The dropped-lines counter as a source of `/metrics`.
    pub fn metrics(&self) -> Arc<dyn MetricsSource> {
        Arc::new(DroppedLines(self.dropped.clone()))
    }
}

/// Sets up the process's log. An explicit level (flag or config) wins over `RUST_LOG`, which
/// is used only when neither says anything. `buffered_lines` bounds the lines waiting for the
/// writer.
pub fn init(format: LogFormat, level: Option<&str>, buffered_lines: usize) -> Log {
    let filter = match level {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let ansi = std::io::stderr().is_terminal();
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(buffered_lines.max(1))
        .thread_name("modelmux-log")
        .finish(BufWriter::with_capacity(64 << 10, std::io::stderr()));
    let dropped = writer.error_counter();
    let lines = writer.clone();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        // A log line that cannot be written (stderr closed) is dropped: reporting it would
        // panic the task that logged, which may be one the server cannot do without.
        .log_internal_errors(false)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Log {
        _writer: guard,
        dropped,
        lines,
        format,
    }
}

/// Access lines into the log's queue: one message per line, dropped and counted when full.
struct Lines(NonBlocking);

impl AccessSink for Lines {
    fn write_line(&self, line: &[u8]) {
        // A clone is a channel sender's: one atomic increment.
        let _ = self.0.clone().write_all(line);
    }
}

struct DroppedLines(ErrorCounter);

impl MetricsSource for DroppedLines {
    fn collect(&self) -> Vec<MetricFamily> {
        vec![MetricFamily::single(
            "modelmux_log_lines_dropped_total",
            "Log lines dropped because the log's buffer was full (stderr not read fast enough).",
            MetricKind::Counter,
            MetricValue::Number(self.0.dropped_lines() as f64),
        )]
    }
}
