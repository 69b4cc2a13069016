//! The access line: one per application request, formatted on the request's task.
//!
//! By default it is a `tracing` event (target `modelmux::access`, INFO), formatted by whatever
//! subscriber the process installed. A server given an [`AccessSink`] formats the line itself
//! instead, in the same shape as `tracing`'s text or JSON lines, and hands the bytes to the
//! sink: a general-purpose event formatter costs a few microseconds a line (field visitors,
//! escaping through `Debug`, many small writes), which at tens of thousands of requests a
//! second is a large share of a request. Either way the line is written only while
//! `modelmux::access` is enabled at INFO, so `logging.level: info,modelmux::access=warn`
//! turns it off.
//!
//! A path comes from the client, and httparse passes bytes of 0x80 and above, so a line must
//! never carry a character a terminal or log viewer acts on ([`is_unsafe_in_text`]: C0 and C1
//! controls such as U+009B, an 8-bit CSI; U+2028 and U+2029; bidirectional overrides): text
//! lines escape them as `Debug` does, JSON lines as `\uXXXX`. The check stays one pass over
//! the bytes for ASCII values (the common case); only a value with non-ASCII bytes is walked
//! again by character.

use std::io::Write as _;
use std::sync::Arc;

use std::borrow::Cow;

use modelmux_cache::ModelId;
use modelmux_context::RequestId;
use modelmux_types::is_unsafe_in_text;

/// Where formatted access lines go (a writer thread behind a bounded queue, say). Must not
/// block: it is called on the request's task.
pub trait AccessSink: Send + Sync + 'static {
    /// Takes one whole line, newline included.
    fn write_line(&self, line: &[u8]);
}

/// How a sink's lines are shaped, as the process's other log lines are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessFormat {
    /// `tracing`'s default text line.
    Text,
    /// `tracing`'s JSON line: `{"timestamp", "level", "fields": {...}, "target"}`.
    Json,
}

/// A configured sink and its format.
#[derive(Clone)]
pub(crate) struct AccessLog {
    pub(crate) sink: Arc<dyn AccessSink>,
    pub(crate) format: AccessFormat,
}

/// What one access line says.
pub(crate) struct AccessEntry<'a> {
    pub(crate) request_id: &'a RequestId,
    pub(crate) method: &'a str,
    pub(crate) path: &'a str,
    pub(crate) app: &'a str,
    pub(crate) replica: &'a str,
    pub(crate) model: Option<&'a ModelId>,
    pub(crate) status: u16,
    pub(crate) ms: f64,
    pub(crate) error: Option<&'static str>,
}

impl AccessEntry<'_> {
    /// Writes the line: through `log`'s sink when there is one, else as a `tracing` event.
    pub(crate) fn write(&self, log: Option<&AccessLog>) {
        let Some(log) = log else {
            // The subscriber's JSON lines would write these characters raw: they are spelled
            // out (`\u{9b}`) first.
            tracing::info!(
                target: "modelmux::access",
                request_id = self.request_id.as_str(),
                method = self.method,
                path = &*spelled_out(self.path),
                app = &*spelled_out(self.app),
                replica = &*spelled_out(self.replica),
                model_id = &*spelled_out(self.model.map_or("-", |m| m.as_str())),
                status = self.status,
                ms = format_args!("{:.2}", self.ms),
                error = self.error,
            );
            return;
        };
        thread_local! {
            static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            match log.format {
                AccessFormat::Text => self.text(line),
                AccessFormat::Json => self.json(line),
            }
            log.sink.write_line(line);
        });
    }

    fn text(&self, out: &mut Vec<u8>) {
        timestamp(out, std::time::SystemTime::now());
        out.extend_from_slice(b"  INFO modelmux::access: request_id=");
        quoted(out, self.request_id.as_str());
        for (key, value) in [
            (" method=", self.method),
            (" path=", self.path),
            (" app=", self.app),
            (" replica=", self.replica),
            (" model_id=", self.model.map_or("-", |m| m.as_str())),
        ] {
            out.extend_from_slice(key.as_bytes());
            quoted(out, value);
        }
        out.extend_from_slice(b" status=");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.extend_from_slice(b" ms=");
        milliseconds(out, self.ms);
        if let Some(error) = self.error {
            out.extend_from_slice(b" error=");
            quoted(out, error);
        }
        out.push(b'\n');
    }

    fn json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"timestamp\":\"");
        timestamp(out, std::time::SystemTime::now());
        out.extend_from_slice(b"\",\"level\":\"INFO\",\"fields\":{\"request_id\":");
        json_string(out, self.request_id.as_str());
        for (key, value) in [
            (",\"method\":", self.method),
            (",\"path\":", self.path),
            (",\"app\":", self.app),
            (",\"replica\":", self.replica),
            (",\"model_id\":", self.model.map_or("-", |m| m.as_str())),
        ] {
            out.extend_from_slice(key.as_bytes());
            json_string(out, value);
        }
        out.extend_from_slice(b",\"status\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.status).as_bytes());
        out.extend_from_slice(b",\"ms\":");
        milliseconds(out, self.ms);
        if let Some(error) = self.error {
            out.extend_from_slice(b",\"error\":");
            json_string(out, error);
        }
        out.extend_from_slice(b"},\"target\":\"modelmux::access\"}\n");
    }
}

/// `ms` with two decimals, as `{:.2}` writes it, in integer arithmetic (float formatting is a
/// visible share of a line's cost).
fn milliseconds(out: &mut Vec<u8>, ms: f64) {
    if !(0.0..1e12).contains(&ms) {
        let _ = write!(out, "{ms:.2}");
        return;
    }
    let hundredths = (ms * 100.0).round() as u64;
    out.extend_from_slice(itoa::Buffer::new().format(hundredths / 100).as_bytes());
    let cents = (hundredths % 100) as u8;
    out.extend_from_slice(&[b'.', b'0' + cents / 10, b'0' + cents % 10]);
}

/// The current time as `tracing`'s lines show it (RFC 3339 in UTC, to the microsecond). The
/// date and time of day are formatted once a second per thread; each line adds its
/// microseconds (a calendar conversion per line was a visible share of its cost).
fn timestamp(out: &mut Vec<u8>, now: std::time::SystemTime) {
    thread_local! {
        /// The second last formatted on this thread, and its `YYYY-MM-DDTHH:MM:SS.`.
        static SECOND: std::cell::Cell<(u64, [u8; 20])> = const {
            std::cell::Cell::new((u64::MAX, [0; 20]))
        };
    }
    let Ok(since) = now.duration_since(std::time::UNIX_EPOCH) else {
        // A clock before 1970 (humantime panics on one).
        return out.push(b'-');
    };
    let secs = since.as_secs();
    let prefix = SECOND.with(|second| {
        let (cached, prefix) = second.get();
        if cached == secs {
            return Some(prefix);
        }
        // `YYYY-MM-DDTHH:MM:SS.uuuuuuZ`, of which the part before the microseconds is kept;
        // none past the year 9999, which humantime cannot write.
        let mut whole = String::with_capacity(27);
        std::fmt::Write::write_fmt(
            &mut whole,
            format_args!("{}", humantime::format_rfc3339_micros(now)),
        )
        .ok()?;
        let prefix: [u8; 20] = whole.as_bytes().get(..20)?.try_into().ok()?;
        second.set((secs, prefix));
        Some(prefix)
    });
    let Some(prefix) = prefix else {
        return out.push(b'-');
    };
    out.extend_from_slice(&prefix);
    let mut micros = since.subsec_micros();
    let mut digits = [b'0'; 6];
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    out.extend_from_slice(&digits);
    out.push(b'Z');
}

/// Whether `value` can go between double quotes as it is, in a text or a JSON line: no quote,
/// no backslash, and nothing [`is_unsafe_in_text`] (which is escaped by `Debug` too). One pass
/// over the bytes when they are all ASCII; a second, by character, only when some are not.
fn plain(value: &str) -> bool {
    let ascii = |b: u8| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\';
    value.bytes().all(ascii)
        || value.chars().all(|c| {
            if c.is_ascii() {
                ascii(c as u8)
            } else {
                !is_unsafe_in_text(c)
            }
        })
}

/// `value` in double quotes as `tracing`'s text lines show a string (its `Debug` form, which
/// escapes every character [`is_unsafe_in_text`]).
fn quoted(out: &mut Vec<u8>, value: &str) {
    if plain(value) {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{value:?}");
    }
}

/// `value` as a JSON string, with every character [`is_unsafe_in_text`] as `\uXXXX` (a JSON
/// writer escapes only C0 controls, and a line read in a terminal is not parsed first).
fn json_string(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    if plain(value) {
        out.extend_from_slice(value.as_bytes());
    } else {
        for c in value.chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                // All of them are in the Basic Multilingual Plane: one `\uXXXX` each.
                c if is_unsafe_in_text(c) => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
            }
        }
    }
    out.push(b'"');
}

/// `value` with every character [`is_unsafe_in_text`] spelled out as `\u{..}`, for a line
/// whose formatter is not ours.
fn spelled_out(value: &str) -> Cow<'_, str> {
    if !value.chars().any(is_unsafe_in_text) {
        return Cow::Borrowed(value);
    }
    Cow::Owned(
        value
            .chars()
            .map(|c| {
                if is_unsafe_in_text(c) {
                    c.escape_unicode().to_string()
                } else {
                    c.to_string()
                }
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Lines(parking_lot::Mutex<Vec<String>>);

    impl AccessSink for Lines {
        fn write_line(&self, line: &[u8]) {
            self.0
                .lock()
                .push(String::from_utf8(line.to_vec()).unwrap());
        }
    }

    fn entry<'a>(id: &'a RequestId, model: &'a ModelId) -> AccessEntry<'a> {
        AccessEntry {
            request_id: id,
            method: "POST",
            path: "/v1/chat \"x\"",
            app: "llm",
            replica: "LLM#1",
            model: Some(model),
            status: 404,
            ms: 1.234_5,
            error: Some("not_found"),
        }
    }

    #[test]
    fn text_lines_read_as_tracing_writes_them() {
        let sink = Arc::new(Lines(parking_lot::Mutex::default()));
        let log = AccessLog {
            sink: sink.clone(),
            format: AccessFormat::Text,
        };
        let (id, model) = (
            RequestId::new("r1").unwrap(),
            ModelId::new("pirate").unwrap(),
        );
        entry(&id, &model).write(Some(&log));
        let line = sink.0.lock()[0].clone();
        let (time, rest) = line.split_once("  ").unwrap();
        assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");
        assert_eq!(
            rest,
            "INFO modelmux::access: request_id=\"r1\" method=\"POST\" path=\"/v1/chat \\\"x\\\"\" \
             app=\"llm\" replica=\"LLM#1\" model_id=\"pirate\" status=404 ms=1.23 \
             error=\"not_found\"\n"
        );
    }

    #[test]
    fn json_lines_have_tracings_shape() {
        let sink = Arc::new(Lines(parking_lot::Mutex::default()));
        let log = AccessLog {
            sink: sink.clone(),
            format: AccessFormat::Json,
        };
        let (id, model) = (
            RequestId::new("r1").unwrap(),
            ModelId::new("pirate").unwrap(),
        );
        entry(&id, &model).write(Some(&log));
        let line: serde_json::Value = serde_json::from_str(&sink.0.lock()[0]).unwrap();
        assert_eq!(line["target"], "modelmux::access");
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["fields"]["path"], "/v1/chat \"x\"");
        assert_eq!(line["fields"]["model_id"], "pirate");
        assert_eq!(line["fields"]["status"], 404);
        assert_eq!(line["fields"]["ms"], 1.23);
        assert_eq!(line["fields"]["error"], "not_found");
        assert!(humantime::parse_rfc3339(line["timestamp"].as_str().unwrap()).is_ok());
    }

    /// Every character a terminal acts on, in a client's path.
    const HOSTILE: &str = "/a\u{1b}[2J\u{85}\u{9b}31mX\u{2028}\u{2029}INFO fake\u{202e}\u{202a}\u{202b}\
                           \u{202c}\u{202d}\u{2066}\u{2067}\u{2068}\u{2069}\u{200e}\u{200f}\u{61c}\u{7f}ü";

    fn lines(format: AccessFormat, path: &str) -> String {
        let sink = Arc::new(Lines(parking_lot::Mutex::default()));
        let log = AccessLog {
            sink: sink.clone(),
            format,
        };
        let (id, model) = (
            RequestId::new("r1").unwrap(),
            ModelId::new("pirate").unwrap(),
        );
        AccessEntry {
            path,
            ..entry(&id, &model)
        }
        .write(Some(&log));
        sink.0.lock()[0].clone()
    }

    #[test]
    fn c1_controls_separators_and_bidi_overrides_are_escaped() {
        for format in [AccessFormat::Text, AccessFormat::Json] {
            let line = lines(format, HOSTILE);
            let raw: Vec<char> = line.chars().filter(|&c| is_unsafe_in_text(c)).collect();
            assert_eq!(raw, ['\n'], "{format:?}: {line:?}");
            assert!(line.contains('ü'), "{line}");
            if format == AccessFormat::Json {
                let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
                assert_eq!(parsed["fields"]["path"], HOSTILE);
                assert!(
                    line.contains(r"\u009b31mX\u2028\u2029INFO fake\u202e"),
                    "{line}"
                );
            } else {
                assert!(line.contains(&format!("path={HOSTILE:?} ")), "{line}");
                assert!(
                    line.contains(r"\u{9b}31mX\u{2028}\u{2029}INFO fake\u{202e}"),
                    "{line}"
                );
            }
        }
        // Each alone too, and text that is safe stays as it is.
        for c in HOSTILE.chars().filter(|&c| is_unsafe_in_text(c)) {
            for format in [AccessFormat::Text, AccessFormat::Json] {
                let line = lines(format, &format!("/x{c}y"));
                assert!(
                    !line[..line.len() - 1].contains(c),
                    "U+{:04X}: {line:?}",
                    c as u32
                );
            }
        }
        assert!(lines(AccessFormat::Text, "/ünï/日本").contains("path=\"/ünï/日本\""));
        assert!(lines(AccessFormat::Json, "/ünï/日本").contains("\"path\":\"/ünï/日本\""));
        assert_eq!(spelled_out("/a\u{9b}b"), "/a\\u{9b}b");
        assert!(matches!(spelled_out("/ü"), Cow::Borrowed(_)));
    }

    #[test]
    fn timestamps_read_as_humantime_writes_them() {
        use std::time::{Duration, UNIX_EPOCH};
        let at =
            |secs: u64, micros: u64| UNIX_EPOCH + Duration::from_micros(secs * 1_000_000 + micros);
        // The same second twice (the cached date), the next second, a new day and year, the
        // first second after the epoch, and times the cache does not cover.
        for now in [
            at(1_764_150_748, 6_016),
            at(1_764_150_748, 999_999),
            at(1_764_150_749, 0),
            at(1_767_225_599, 500_000),
            at(1_767_225_600, 1),
            at(0, 7),
            at(1_767_225_600, 1),
            at(400_000_000_000, 12),
            UNIX_EPOCH - Duration::from_secs(5),
        ] {
            let mut out = Vec::new();
            timestamp(&mut out, now);
            let mut want = String::new();
            if now < UNIX_EPOCH
                || std::fmt::Write::write_fmt(
                    &mut want,
                    format_args!("{}", humantime::format_rfc3339_micros(now)),
                )
                .is_err()
            {
                want = "-".into();
            }
            assert_eq!(String::from_utf8(out).unwrap(), want);
        }
    }

    #[test]
    fn milliseconds_read_as_two_decimals() {
        for (ms, want) in [
            (0.0, "0.00"),
            (0.004, "0.00"),
            (0.006, "0.01"),
            (1.2345, "1.23"),
            (6.618_892_000_000_001, "6.62"),
            (999.999, "1000.00"),
            (123_456.7, "123456.70"),
            (f64::NAN, "NaN"),
        ] {
            let mut out = Vec::new();
            milliseconds(&mut out, ms);
            assert_eq!(String::from_utf8(out).unwrap(), want, "{ms}");
        }
        // Durations as they come, from nanoseconds: within half a hundredth of `{:.2}`.
        for nanos in (0..2_000_000u64).step_by(7_919) {
            let ms = nanos as f64 / 1e6;
            let mut out = Vec::new();
            milliseconds(&mut out, ms);
            let ours: f64 = String::from_utf8(out).unwrap().parse().unwrap();
            let std: f64 = format!("{ms:.2}").parse().unwrap();
            assert!((ours - std).abs() < 0.010_001, "{ms}: {ours} vs {std}");
            assert!((ours - ms).abs() <= 0.005 + 1e-9, "{ms}: {ours}");
        }
    }
}
