//! Metrics a deployment adds to `/metrics` (an LLM engine's token counts and latencies, say):
//! each replica registers a [`MetricsSource`], and at scrape time every source's families are
//! merged by name, so each family gets its HELP and TYPE once and every sample the replica's
//! `app`, `deployment` and `replica` labels.

use modelmux_cache::HistogramSnapshot;

/// What a family measures, as Prometheus types it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets (cumulative counts, a sum and a count).
    Histogram,
}

impl MetricKind {
    /// Its name in the exposition format (`counter`, `gauge`, `histogram`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Counter => "counter",
            Self::Gauge => "gauge",
            Self::Histogram => "histogram",
        }
    }
}

/// One sample's value.
#[derive(Clone, Debug)]
pub enum MetricValue {
    /// A number (counter or gauge).
    Number(f64),
    /// A histogram (durations: the sum is in seconds).
    Histogram(HistogramSnapshot),
}

/// One sample: its own labels (besides the replica's) and its value.
#[derive(Clone, Debug)]
pub struct MetricSample {
    /// Labels, such as `("model", "pirate")`. Keep their values bounded (model ids held in a
    /// capped cache are; request ids are not).
    pub labels: Vec<(&'static str, String)>,
    /// The value.
    pub value: MetricValue,
}

/// One metric family of one replica.
#[derive(Clone, Debug)]
pub struct MetricFamily {
    /// Its name, `modelmux_...` by convention.
    pub name: &'static str,
    /// What it measures.
    pub help: &'static str,
    /// Its type.
    pub kind: MetricKind,
    /// Its samples on this replica.
    pub samples: Vec<MetricSample>,
}

impl MetricFamily {
    /// A family with one unlabelled sample.
    pub fn single(
        name: &'static str,
        help: &'static str,
        kind: MetricKind,
        value: MetricValue,
    ) -> Self {
        Self {
            name,
            help,
            kind,
            samples: vec![MetricSample {
                labels: Vec::new(),
                value,
            }],
        }
    }
}

/// Something that reports metrics of a replica at scrape time (see
/// [`ReplicaContext::register_metrics`](crate::ReplicaContext::register_metrics)). It is
/// called on the scraping task: read counters, do not wait.
pub trait MetricsSource: Send + Sync + 'static {
    /// The replica's families now.
    fn collect(&self) -> Vec<MetricFamily>;

    /// Which of its families the dashboard charts (none by default).
    fn dashboard(&self) -> Option<DashboardSeries> {
        None
    }
}

/// The families of a [`MetricsSource`] that the dashboard charts, each named as the source
/// collects it: a kind that generates tokens (an LLM engine) marks its own series here, and
/// the dashboard reads them by this mark, whatever the kind calls them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DashboardSeries {
    /// Tokens generated (a counter).
    pub generation_tokens: &'static str,
    /// Prompt tokens processed (a counter).
    pub prompt_tokens: &'static str,
    /// Requests running in the batch (a gauge, summed over replicas).
    pub running: &'static str,
    /// Requests waiting for room (a gauge, summed over replicas).
    pub waiting: &'static str,
    /// The share of its cache in use, 1 being full (a gauge, averaged over replicas).
    pub cache_usage: &'static str,
    /// Time to the first token (a histogram, in seconds).
    pub time_to_first_token: &'static str,
}
