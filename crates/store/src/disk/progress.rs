//! Progress of a long download, logged every few seconds under the file's name (not a hash):
//! bytes so far, percent of the size the store announced, and the rate since the last line.

use std::time::Duration;

use tokio::time::Instant;

/// How often a download in progress says how far it is.
pub(super) const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// Counts a download's bytes and says, at most every [`PROGRESS_EVERY`], how far it is.
pub(super) struct Progress {
    name: String,
    total: u64,
    received: u64,
    last_at: Instant,
    last_bytes: u64,
}

impl Progress {
    /// A download of `total` bytes of `name` starting `now`.
    pub(super) fn new(name: String, total: u64, now: Instant) -> Self {
        Self {
            name,
            total,
            received: 0,
            last_at: now,
            last_bytes: 0,
        }
    }

    /// Counts `bytes` more received at `now`; returns the line to log when one is due.
    pub(super) fn received(&mut self, bytes: u64, now: Instant) -> Option<String> {
        self.received += bytes;
        let elapsed = now.saturating_duration_since(self.last_at);
        if elapsed < PROGRESS_EVERY {
            return None;
        }
        let rate = (self.received - self.last_bytes) as f64 / elapsed.as_secs_f64();
        self.last_at = now;
        self.last_bytes = self.received;
        let percent = if self.total == 0 {
            100.0
        } else {
            self.received as f64 * 100.0 / self.total as f64
        };
        Some(format!(
            "downloading {}: {} of {} ({percent:.0}%), {}/s",
            self.name,
            human_bytes(self.received as f64),
            human_bytes(self.total as f64),
            human_bytes(rate)
        ))
    }
}

/// `bytes` in B, KiB, MiB or GiB, one decimal.
fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_every_five_seconds_with_bytes_percent_and_rate() {
        let start = Instant::now();
        let mut p = Progress::new("smollm2/model.gguf".into(), 100 << 20, start);
        assert_eq!(p.received(10 << 20, start + Duration::from_secs(1)), None);
        let line = p
            .received(15 << 20, start + Duration::from_secs(5))
            .expect("a line after 5 s");
        assert_eq!(
            line,
            "downloading smollm2/model.gguf: 25.0 MiB of 100.0 MiB (25%), 5.0 MiB/s"
        );
        // The next line waits another 5 s, and its rate is since the last line.
        assert_eq!(p.received(5 << 20, start + Duration::from_secs(9)), None);
        let line = p
            .received(5 << 20, start + Duration::from_secs(10))
            .unwrap();
        assert!(
            line.ends_with("35.0 MiB of 100.0 MiB (35%), 2.0 MiB/s"),
            "{line}"
        );
        assert_eq!(human_bytes(512.0), "512 B");
    }
}
