//! `modelmux-promtext`: reads a `/metrics` page (the Prometheus text exposition format,
//! version 0.0.4, or OpenMetrics text, whose `# EOF` is a comment here) into its samples, so
//! that tests and `modelmux bench` read values, not lines.
//!
//! ```
//! let page = modelmux_promtext::parse(
//!     "# TYPE requests_total counter\n\
//!      requests_total{status=\"2xx\",app=\"a\"} 3\n\
//!      requests_total{status=\"5xx\",app=\"a\"} 1\n",
//! )
//! .unwrap();
//! assert_eq!(page.sum("requests_total"), 4.0);
//! assert_eq!(page.value("requests_total", &[("status", "5xx")]), Some(1.0));
//! assert_eq!(page.kind("requests_total"), Some("counter"));
//! ```
//!
//! Strict where a test wants it to be: a line that is not a comment, a blank or a well-formed
//! sample is an error, with its line number, so a broken exposition fails the test reading it.
//!
//! Written here rather than taken from `prometheus-parse` (0.2.5, last released in 2023), which
//! brings regex, chrono, itertools and lazy_static for a grammar of a few lines.

mod parse;

pub use parse::{ParseError, parse};

use std::collections::HashMap;

/// One sample: a series (name and labels) and its value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The series' name, with its suffix (`_total`, `_bucket`, `_sum`, `_count`).
    pub name: String,
    /// Its labels in the order written, values unescaped.
    pub labels: Vec<(String, String)>,
    /// Its value (`+Inf`, `-Inf` and `NaN` included).
    pub value: f64,
    /// Its timestamp in milliseconds, when one was written.
    pub timestamp: Option<i64>,
}

impl Sample {
    /// The value of label `key`, if the sample has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// Whether the sample has every label of `labels`, with those values (others may follow).
    pub fn matches(&self, labels: &[(&str, &str)]) -> bool {
        labels.iter().all(|(k, v)| self.label(k) == Some(*v))
    }
}

/// A histogram's series, as one sample set of `_bucket`, `_sum` and `_count` reads.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// `(le, cumulative count)` in the order written, `+Inf` last.
    pub buckets: Vec<(f64, f64)>,
    /// `_sum`.
    pub sum: f64,
    /// `_count`.
    pub count: f64,
}

/// A parsed page: its samples in order, and each family's `# TYPE` and `# HELP`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Page {
    /// Every sample, in the page's order.
    pub samples: Vec<Sample>,
    types: HashMap<String, String>,
    help: HashMap<String, String>,
}

impl Page {
    /// The samples named `name` exactly.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The samples named `name` that have every label of `labels`.
    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples(name).filter(move |s| s.matches(labels))
    }

    /// The sum of every sample named `name` (0 when there is none).
    pub fn sum(&self, name: &str) -> f64 {
        self.samples(name).map(|s| s.value).sum()
    }

    /// The sum of the samples named `name` that have every label of `labels`.
    pub fn sum_where(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// The value of the one sample named `name` that has every label of `labels`; `None`
    /// when there is none.
    ///
    /// # Panics
    ///
    /// When several samples match: the caller meant one series and named too few labels.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self.matching(name, labels);
        let first = found.next()?;
        assert!(
            found.next().is_none(),
            "several {name} samples have the labels {labels:?}"
        );
        Some(first.value)
    }

    /// Whether a sample named `name` exists.
    pub fn has(&self, name: &str) -> bool {
        self.samples(name).next().is_some()
    }

    /// Family `family`'s `# TYPE` (`counter`, `gauge`, `histogram`, ...).
    pub fn kind(&self, family: &str) -> Option<&str> {
        self.types.get(family).map(String::as_str)
    }

    /// Family `family`'s `# HELP`, unescaped.
    pub fn help(&self, family: &str) -> Option<&str> {
        self.help.get(family).map(String::as_str)
    }

    /// The histogram `name` (its `_bucket`, `_sum` and `_count` series) of the one series
    /// with every label of `labels`; `None` when its `_count` is missing.
    ///
    /// # Panics
    ///
    /// When several series match, as [`value`](Self::value).
    pub fn histogram(&self, name: &str, labels: &[(&str, &str)]) -> Option<Histogram> {
        let count = self.value(&format!("{name}_count"), labels)?;
        let sum = self
            .value(&format!("{name}_sum"), labels)
            .unwrap_or(f64::NAN);
        let buckets = self
            .matching(&format!("{name}_bucket"), labels)
            .filter_map(|s| Some((parse::value(s.label("le")?).ok()?, s.value)))
            .collect();
        Some(Histogram {
            buckets,
            sum,
            count,
        })
    }
}

#[cfg(test)]
mod tests;
