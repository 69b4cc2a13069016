//! A bounded, batching line buffer in front of stderr.
//!
//! Tasks append whole lines under a short lock (a memory copy); a writer thread takes
//! everything buffered every few milliseconds, or at once when a batch is large, and writes it
//! with one call. A request therefore never makes a system call to log: no `write`, and no
//! wake-up of the writer per line (a channel whose receiver sleeps between lines costs a
//! futex wake on nearly every send). When the buffer is full (stderr is not being read fast
//! enough) a line is dropped and counted, never waited for.
//!
//! Written here rather than with tracing-appender's non-blocking writer for that reason: it
//! sends each line through a channel and wakes its worker for it.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// How often the writer looks for lines when no batch filled up.
const FLUSH_EVERY: Duration = Duration::from_millis(10);
/// A batch this large is written at once.
const BATCH_BYTES: usize = 64 << 10;

struct Shared {
    lines: Mutex<Vec<u8>>,
    /// Bytes the buffer may hold.
    capacity: usize,
    dropped: AtomicU64,
    wake: Condvar,
    closing: AtomicBool,
}

/// The appending side (cheap to clone).
#[derive(Clone)]
pub(super) struct LineBuffer(Arc<Shared>);

/// How long dropping the [`Writer`] waits for the last lines to be written: a stderr nobody
/// reads must not keep the process from exiting.
const LAST_WRITE: Duration = Duration::from_secs(2);

/// Keeps the writer thread running; on drop, it writes what is buffered (waiting at most
/// [`LAST_WRITE`]) and stops.
pub(super) struct Writer {
    shared: Arc<Shared>,
    stopped: std::sync::mpsc::Receiver<()>,
}

impl LineBuffer {
    /// A buffer of `capacity` bytes drained into `out` by a thread of its own.
    pub(super) fn start(
        capacity: usize,
        out: impl Write + Send + 'static,
    ) -> std::io::Result<(Self, Writer)> {
        let shared = Arc::new(Shared {
            lines: Mutex::new(Vec::with_capacity(BATCH_BYTES)),
            capacity: capacity.max(1),
            dropped: AtomicU64::new(0),
            wake: Condvar::new(),
            closing: AtomicBool::new(false),
        });
        let drained = shared.clone();
        let (stop, stopped) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("modelmux-log".into())
            .spawn(move || {
                drain(&drained, out);
                let _ = stop.send(());
            })?;
        Ok((Self(shared.clone()), Writer { shared, stopped }))
    }

    /// Appends one whole line (or several), or drops it when the buffer is full.
    pub(super) fn push(&self, line: &[u8]) {
        let mut lines = self.0.lines.lock();
        if lines.len() + line.len() > self.0.capacity {
            drop(lines);
            self.0.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        lines.extend_from_slice(line);
        let full = lines.len() >= BATCH_BYTES;
        drop(lines);
        if full {
            self.0.wake.notify_one();
        }
    }

    /// Lines dropped so far.
    pub(super) fn dropped(&self) -> u64 {
        self.0.dropped.load(Ordering::Relaxed)
    }
}

impl Write for LineBuffer {
    /// `tracing`'s formatter writes each event with one call: the event is one push.
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.push(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LineBuffer {
    type Writer = LineBuffer;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// The writer thread: takes the buffered lines and writes them, until told to close.
fn drain(shared: &Shared, mut out: impl Write) {
    let mut batch = Vec::with_capacity(BATCH_BYTES);
    loop {
        {
            let mut lines = shared.lines.lock();
            if lines.len() < BATCH_BYTES && !shared.closing.load(Ordering::SeqCst) {
                shared.wake.wait_for(&mut lines, FLUSH_EVERY);
            }
            std::mem::swap(&mut *lines, &mut batch);
        }
        let closing = shared.closing.load(Ordering::SeqCst);
        if !batch.is_empty() {
            // A line that cannot be written (stderr closed) is lost; the server goes on.
            let _ = out.write_all(&batch).and_then(|()| out.flush());
            batch.clear();
        }
        if closing && shared.lines.lock().is_empty() {
            return;
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        let _ = self.stopped.recv_timeout(LAST_WRITE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the writer thread wrote.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_is_written_whole_and_in_order_by_the_time_the_writer_stops() {
        let sink = Sink::default();
        let (buffer, writer) = LineBuffer::start(1 << 20, sink.clone()).unwrap();
        std::thread::scope(|s| {
            for t in 0..4 {
                let buffer = buffer.clone();
                s.spawn(move || {
                    for i in 0..2000 {
                        buffer.push(format!("t{t} line {i}\n").as_bytes());
                    }
                });
            }
        });
        drop(writer);
        let text = String::from_utf8(sink.0.lock().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 8000);
        for t in 0..4 {
            let prefix = format!("t{t} line ");
            let mine: Vec<usize> = lines
                .iter()
                .filter_map(|l| l.strip_prefix(&prefix))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(mine, (0..2000).collect::<Vec<_>>(), "thread {t}'s lines");
        }
        assert_eq!(buffer.dropped(), 0);
    }

    #[test]
    fn a_full_buffer_drops_and_counts_lines_instead_of_waiting() {
        /// A writer that never returns until released: stderr nobody reads.
        struct Stuck(Arc<(Mutex<bool>, Condvar)>);
        impl Write for Stuck {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                let mut released = self.0.0.lock();
                while !*released {
                    self.0.1.wait(&mut released);
                }
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (buffer, writer) = LineBuffer::start(100, Stuck(gate.clone())).unwrap();
        // The first lines may reach the stuck writer; the rest fill 100 bytes, then drop. On a
        // thread, so pushes that waited for the writer fail the test instead of hanging it.
        let (done, pushed) = std::sync::mpsc::channel();
        let pusher = buffer.clone();
        std::thread::spawn(move || {
            for _ in 0..1000 {
                pusher.push(b"0123456789\n");
            }
            let _ = done.send(());
        });
        pushed
            .recv_timeout(Duration::from_secs(60))
            .expect("pushes waited for a stuck writer");
        assert!(
            buffer.dropped() >= 1000 - 2 * (100 / 11),
            "{}",
            buffer.dropped()
        );
        *gate.0.lock() = true;
        gate.1.notify_all();
        drop(writer);
    }
}
