//! A trace: the requests to replay (when each arrived, the model it named, how long serving it
//! took, if known) and what the input said of the models (load times, sizes).
//!
//! Three shapes are read, told apart line by line:
//! - CSV: `timestamp,model_id[,service_ms][,bytes]`, an optional header line naming those
//!   columns; a timestamp is seconds (any origin) or an RFC 3339 time;
//! - JSON lines: `{"timestamp": .., "model_id": "..", "service_ms": .., "bytes": ..}`;
//! - modelmux's own log, text or JSON: its access lines (`modelmux::access`: the time a
//!   request ended, its model, its `ms`, so it arrived `ms` before) and its cache's load lines
//!   (`Loaded model 'x' in 12.3ms.`, with `size_bytes`), which give each model's measured load
//!   time (the median of its loads) and size; other lines of the log are passed over.

use std::collections::HashMap;
use std::time::{Duration, UNIX_EPOCH};

use modelmux_cache::ModelId;

/// One request of a trace.
#[derive(Debug, Clone)]
pub struct TraceRequest {
    /// When it arrived, after the trace's first request.
    pub at: Duration,
    /// The model it named, as an index into [`Trace::models`].
    pub model: u32,
    /// How long serving it took once its model was there, when the trace says.
    pub service: Option<Duration>,
}

/// What the input said of one model.
#[derive(Debug, Clone, Default)]
pub struct ModelFacts {
    /// Its loads' measured times (from load lines).
    pub load_times: Vec<Duration>,
    /// Its size in bytes (a trace's `bytes` column or a load line's `size_bytes`).
    pub size_bytes: Option<u64>,
}

/// A parsed trace, its requests in arrival order.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The requests, sorted by arrival.
    pub requests: Vec<TraceRequest>,
    /// The models the requests name, each once.
    pub models: Vec<ModelId>,
    /// What the input said of each model, by the same index.
    pub facts: Vec<ModelFacts>,
}

/// Why a trace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// A line that is none of the shapes, or a field that does not parse.
    #[error("line {line}: {message}")]
    Line {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// No request in the whole input.
    #[error("the trace holds no request (read {lines} lines)")]
    Empty {
        /// Lines read.
        lines: usize,
    },
}

impl Trace {
    /// Parses `text` (see the module's documentation).
    pub fn parse(text: &str) -> Result<Self, TraceError> {
        let mut builder = Builder::default();
        let mut lines = 0;
        for (i, raw) in text.lines().enumerate() {
            lines = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            builder.line(line).map_err(|message| TraceError::Line {
                line: i + 1,
                message,
            })?;
        }
        builder.finish(lines)
    }

    /// The time from the first request to the last.
    pub fn span(&self) -> Duration {
        self.requests.last().map_or(Duration::ZERO, |r| r.at)
    }

    /// The model of request `r`.
    pub fn model_of(&self, r: &TraceRequest) -> &ModelId {
        &self.models[r.model as usize]
    }
}

/// One request as read, its time absolute (microseconds since the epoch, or since any origin).
struct Arrival {
    at: i64,
    model: u32,
    service: Option<Duration>,
}

#[derive(Default)]
struct Builder {
    arrivals: Vec<Arrival>,
    models: Vec<ModelId>,
    index: HashMap<ModelId, u32, foldhash::fast::RandomState>,
    facts: Vec<ModelFacts>,
    /// Whether a line was read yet (a CSV header may only be the first).
    seen_any: bool,
}

impl Builder {
    fn intern(&mut self, id: &str) -> Result<u32, String> {
        // Looked up by the text first: only a new id is checked and allocated.
        if let Some(&i) = self.index.get(id) {
            return Ok(i);
        }
        let id = ModelId::new(id).map_err(|e| format!("model id: {e}"))?;
        let i = u32::try_from(self.models.len()).map_err(|_| "too many models".to_string())?;
        self.index.insert(id.clone(), i);
        self.models.push(id);
        self.facts.push(ModelFacts::default());
        Ok(i)
    }

    fn line(&mut self, line: &str) -> Result<(), String> {
        let first = !std::mem::replace(&mut self.seen_any, true);
        if line.starts_with('{') {
            return self.json_line(line);
        }
        // A log line has words; most CSV lines have no white space, and skip the searches.
        if line.contains(char::is_whitespace) {
            if line.contains("modelmux::access") || line.contains("Loaded model '") {
                return self.text_log_line(line);
            }
            if looks_like_log(line) {
                return Ok(());
            }
        }
        self.csv_line(line, first)
    }

    fn csv_line(&mut self, line: &str, first: bool) -> Result<(), String> {
        let fields: smallvec::SmallVec<[&str; 4]> = line.split(',').map(str::trim).collect();
        if first
            && fields
                .first()
                .is_some_and(|f| f.eq_ignore_ascii_case("timestamp"))
        {
            return Ok(());
        }
        if !(2..=4).contains(&fields.len()) {
            return Err(format!(
                "expected `timestamp,model_id[,service_ms][,bytes]`, found {} fields",
                fields.len()
            ));
        }
        let at = timestamp(fields[0])?;
        let model = self.intern(fields[1])?;
        let service = match fields.get(2).filter(|f| !f.is_empty()) {
            Some(f) => Some(milliseconds(f, "service_ms")?),
            None => None,
        };
        if let Some(f) = fields.get(3).filter(|f| !f.is_empty()) {
            let bytes = f
                .parse::<u64>()
                .map_err(|_| format!("bytes: `{f}` is not a whole number"))?;
            self.facts[model as usize].size_bytes = Some(bytes);
        }
        self.arrivals.push(Arrival { at, model, service });
        Ok(())
    }

    fn json_line(&mut self, line: &str) -> Result<(), String> {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
        if let Some(fields) = v.get("fields") {
            // A log line of modelmux's JSON format.
            let target = v["target"].as_str().unwrap_or_default();
            let at = v["timestamp"].as_str().map(timestamp).transpose()?;
            return self.log_fields(target, at, &|k| fields.get(k).map(json_text));
        }
        let at = match &v["timestamp"] {
            serde_json::Value::Number(n) => timestamp(&n.to_string())?,
            serde_json::Value::String(s) => timestamp(s)?,
            _ => return Err("`timestamp` is missing (seconds or an RFC 3339 time)".into()),
        };
        let id = v["model_id"]
            .as_str()
            .ok_or("`model_id` is missing or not a string")?;
        let model = self.intern(id)?;
        let service = match &v["service_ms"] {
            serde_json::Value::Null => None,
            other => Some(milliseconds(&json_text(other), "service_ms")?),
        };
        if let Some(bytes) = v["bytes"].as_u64() {
            self.facts[model as usize].size_bytes = Some(bytes);
        }
        self.arrivals.push(Arrival { at, model, service });
        Ok(())
    }

    /// One line of modelmux's text log (`2026-12-03T09:00:00.123456Z  INFO target: ...`).
    fn text_log_line(&mut self, line: &str) -> Result<(), String> {
        let mut words = line.split_whitespace();
        let at = words.next().map(timestamp).transpose()?;
        let target = words
            .nth(1)
            .map(|t| t.trim_end_matches(':'))
            .unwrap_or_default();
        let fields = text_fields(line);
        self.log_fields(target, at, &|k| fields.get(k).cloned())
    }

    /// An access line becomes a request; a load line adds to its model's facts.
    fn log_fields(
        &mut self,
        target: &str,
        at: Option<i64>,
        field: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        if target == "modelmux::access" {
            let Some(id) = field("model_id").filter(|m| m != "-") else {
                return Ok(()); // a request that named no model
            };
            let ended = at.ok_or("an access line without a timestamp")?;
            let ms = field("ms").ok_or("an access line without `ms`")?;
            let took = milliseconds(&ms, "ms")?;
            let model = self.intern(&id)?;
            self.arrivals.push(Arrival {
                at: ended - took.as_micros() as i64,
                model,
                service: None,
            });
            return Ok(());
        }
        if let (Some(id), Some(ms)) = (field("model_id"), field("duration_ms"))
            && field("message").is_none_or(|m| m.starts_with("Loaded model"))
        {
            let model = self.intern(&id)?;
            let took = milliseconds(&ms, "duration_ms")?;
            let facts = &mut self.facts[model as usize];
            facts.load_times.push(took);
            if let Some(size) = field("size_bytes").and_then(|s| s.parse().ok()) {
                facts.size_bytes = Some(size);
            }
        }
        Ok(())
    }

    fn finish(self, lines: usize) -> Result<Trace, TraceError> {
        let mut arrivals = self.arrivals;
        if arrivals.is_empty() {
            return Err(TraceError::Empty { lines });
        }
        arrivals.sort_by_key(|a| a.at);
        let origin = arrivals[0].at;
        let requests = arrivals
            .into_iter()
            .map(|a| TraceRequest {
                at: Duration::from_micros((a.at - origin).max(0) as u64),
                model: a.model,
                service: a.service,
            })
            .collect();
        Ok(Trace {
            requests,
            models: self.models,
            facts: self.facts,
        })
    }
}

/// A line of modelmux's log that is not one the trace uses (it starts with a timestamp and a
/// level).
fn looks_like_log(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let (Some(first), Some(level)) = (words.next(), words.next()) else {
        return false;
    };
    humantime::parse_rfc3339_weak(first).is_ok()
        && matches!(level, "TRACE" | "DEBUG" | "INFO" | "WARN" | "ERROR")
}

/// The `key=value` fields of a text log line (values quoted or bare).
fn text_fields(line: &str) -> HashMap<&str, String> {
    let mut out = HashMap::new();
    let mut rest = line;
    while let Some(eq) = rest.find('=') {
        let key_start = rest[..eq].rfind(' ').map_or(0, |i| i + 1);
        let key = &rest[key_start..eq];
        let after = &rest[eq + 1..];
        let (value, next) = if let Some(quoted) = after.strip_prefix('"') {
            let mut end = 0;
            let bytes = quoted.as_bytes();
            while end < bytes.len() && (bytes[end] != b'"' || bytes[end - 1] == b'\\') {
                end += 1;
            }
            (
                quoted[..end].replace("\\\"", "\""),
                &quoted[(end + 1).min(quoted.len())..],
            )
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            (after[..end].to_string(), &after[end..])
        };
        out.insert(key, value);
        rest = next;
    }
    out
}

fn json_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Seconds (any origin) or an RFC 3339 time, in microseconds.
fn timestamp(s: &str) -> Result<i64, String> {
    if let Ok(x) = s.parse::<f64>() {
        return if x.is_finite() && (0.0..1e12).contains(&x) {
            Ok((x * 1e6).round() as i64)
        } else {
            Err(format!("timestamp: `{s}` is not a time"))
        };
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|_| format!("timestamp: `{s}` is neither seconds nor an RFC 3339 time"))?;
    Ok(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros() as i64)
}

fn milliseconds(s: &str, what: &str) -> Result<Duration, String> {
    let ms: f64 = s
        .trim_matches('"')
        .parse()
        .map_err(|_| format!("{what}: `{s}` is not a number of milliseconds"))?;
    if !(0.0..1e12).contains(&ms) {
        return Err(format!("{what}: {ms} is out of range"));
    }
    Ok(Duration::from_secs_f64(ms / 1e3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_and_without_a_header_sorted_by_arrival() {
        let t =
            Trace::parse("timestamp,model_id,service_ms\n10.5,a,2\n10.0,b,\n11,a,3.5\n").unwrap();
        let got: Vec<(f64, &str, Option<Duration>)> = t
            .requests
            .iter()
            .map(|r| (r.at.as_secs_f64(), t.model_of(r).as_str(), r.service))
            .collect();
        assert_eq!(
            got,
            vec![
                (0.0, "b", None),
                (0.5, "a", Some(Duration::from_millis(2))),
                (1.0, "a", Some(Duration::from_micros(3500))),
            ]
        );
        assert_eq!(t.models.len(), 2);
    }

    #[test]
    fn json_lines_and_rfc3339_times() {
        let t = Trace::parse(concat!(
            r#"{"timestamp": "2026-12-03T09:00:01Z", "model_id": "x", "bytes": 100}"#,
            "\n",
            r#"{"timestamp": "2026-12-03T09:00:00.5Z", "model_id": "y", "service_ms": 4}"#,
        ))
        .unwrap();
        assert_eq!(t.requests[1].at, Duration::from_millis(500));
        assert_eq!(t.facts[0].size_bytes, Some(100));
        assert_eq!(t.requests[0].service, Some(Duration::from_millis(4)));
    }

    #[test]
    fn modelmux_access_and_load_lines_of_both_formats() {
        let text = concat!(
            "2026-12-03T09:00:00.100000Z  INFO modelmux_cache::load: Loaded model 'm1' in 40.0ms. model_id=m1 duration_ms=40.0 size_bytes=1024\n",
            "2026-12-03T09:00:00.150000Z  INFO modelmux::access: request_id=\"r1\" method=\"GET\" path=\"/\" app=\"a\" replica=\"M#1\" model_id=\"m1\" status=200 ms=50.00\n",
            "2026-12-03T09:00:00.160000Z  INFO modelmux::access: request_id=\"r2\" method=\"GET\" path=\"/-/healthz\" app=\"-\" replica=\"-\" model_id=\"-\" status=200 ms=0.10\n",
            "2026-12-03T09:00:00.170000Z  WARN modelmux_serve: something else entirely\n",
            r#"{"timestamp":"2026-12-03T09:00:00.300000Z","level":"INFO","fields":{"request_id":"r3","model_id":"m2","status":200,"ms":100.0},"target":"modelmux::access"}"#,
            "\n",
            r#"{"timestamp":"2026-12-03T09:00:00.300000Z","level":"INFO","fields":{"message":"Loaded model 'm2' in 80.0ms.","model_id":"m2","duration_ms":80.0,"size_bytes":2048},"target":"modelmux_cache::load"}"#,
        );
        let t = Trace::parse(text).unwrap();
        assert_eq!(t.requests.len(), 2, "the health check named no model");
        // r1 ended at .150 after 50 ms: it arrived at .100; r3 ended at .300 after 100 ms.
        assert_eq!(t.requests[0].at, Duration::ZERO);
        assert_eq!(t.requests[1].at, Duration::from_millis(100));
        assert_eq!(t.facts[0].load_times, vec![Duration::from_millis(40)]);
        assert_eq!(t.facts[1].size_bytes, Some(2048));
    }

    #[test]
    fn a_bad_line_is_named_by_its_number_and_an_empty_trace_is_an_error() {
        let e = Trace::parse("1,a\n2,b\nthree,c\n").unwrap_err().to_string();
        assert_eq!(
            e,
            "line 3: timestamp: `three` is neither seconds nor an RFC 3339 time"
        );
        let e = Trace::parse("1,a,x\n").unwrap_err().to_string();
        assert!(e.starts_with("line 1: service_ms:"), "{e}");
        let e = Trace::parse("1\n").unwrap_err().to_string();
        assert!(e.starts_with("line 1: expected `timestamp,model_id"), "{e}");
        let e = Trace::parse("1,bad id\u{202e}\n").unwrap_err().to_string();
        assert!(e.starts_with("line 1: model id:"), "{e}");
        assert_eq!(
            Trace::parse("").unwrap_err().to_string(),
            "the trace holds no request (read 0 lines)"
        );
        assert_eq!(
            Trace::parse("timestamp,model_id\n# nothing\n")
                .unwrap_err()
                .to_string(),
            "the trace holds no request (read 2 lines)"
        );
    }
}
