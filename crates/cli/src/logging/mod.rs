//! The server's log: lines formatted on the task that logs them and written to stderr by a
//! thread of its own, so a request never waits for a write (an access line per request, a
//! slow or full stderr pipe). The lines wait in a bounded, batching buffer (`buffer.rs`):
//! when it is full, a line is dropped and counted (`modelmux_log_lines_dropped_total`), never
//! waited for.

mod buffer;

use std::io::IsTerminal;
use std::sync::Arc;

use modelmux_front::{AccessFormat, AccessSink};
use modelmux_serve::{MetricFamily, MetricKind, MetricValue, MetricsSource};

use crate::config::LogFormat;
use buffer::{LineBuffer, Writer};

/// Bytes of log lines that may wait for the writer by default.
pub const DEFAULT_BUFFERED_BYTES: usize = 8 << 20;

/// The log writer's handle: keeps its thread running (lines still buffered are written when
/// it drops) and reports the lines it dropped.
#[must_use = "dropping it stops the log writer"]
pub struct Log {
    _writer: Writer,
    lines: LineBuffer,
    format: LogFormat,
}

impl Log {
    /// Lines dropped so far because the buffer was full.
    pub fn dropped_lines(&self) -> u64 {
        self.lines.dropped()
    }

    /// Where the server writes its access lines: the same buffer and writer, in the log's
    /// format, formatted by the server itself (faster than a `tracing` event).
    pub fn access_sink(&self) -> (AccessFormat, Arc<dyn AccessSink>) {
        let format = match self.format {
            LogFormat::Text => AccessFormat::Text,
            LogFormat::Json => AccessFormat::Json,
        };
        (format, Arc::new(self.lines.clone()))
    }

    /// The dropped-lines counter as a source of `/metrics`.
    pub fn metrics(&self) -> Arc<dyn MetricsSource> {
        Arc::new(DroppedLines(self.lines.clone()))
    }
}

/// Sets up the process's log. An explicit level (flag or config) wins over `RUST_LOG`, which
/// is used only when neither says anything. `buffered_bytes` bounds the lines waiting for the
/// writer.
pub fn init(format: LogFormat, level: Option<&str>, buffered_bytes: usize) -> std::io::Result<Log> {
    let filter = match level {
        Some(level) => tracing_subscriber::EnvFilter::new(level),
        None => tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
    };
    let ansi = std::io::stderr().is_terminal();
    let (lines, writer) = LineBuffer::start(buffered_bytes, std::io::stderr())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(lines.clone())
        // A log line that cannot be written (stderr closed) is dropped: reporting it would
        // panic the task that logged, which may be one the server cannot do without.
        .log_internal_errors(false)
        .with_ansi(ansi);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(Log {
        _writer: writer,
        lines,
        format,
    })
}

impl AccessSink for LineBuffer {
    fn write_line(&self, line: &[u8]) {
        self.push(line);
    }
}

struct DroppedLines(LineBuffer);

impl MetricsSource for DroppedLines {
    fn collect(&self) -> Vec<MetricFamily> {
        vec![MetricFamily::single(
            "modelmux_log_lines_dropped_total",
            "Log lines dropped because the log's buffer was full (stderr not read fast enough).",
            MetricKind::Counter,
            MetricValue::Number(self.0.dropped() as f64),
        )]
    }
}
