//! `modelmux-synthetic`: a model kind for demos, tests and benchmarks.
//!
//! A synthetic model takes `load_ms` to load, really allocates and writes `size_mb` of memory
//! (so resident memory and byte caps are real), takes `infer_ms` per request and `unload_ms`
//! to unload, and fails to load if its id is in `fail_ids` (or at random, `fail_rate` of its
//! loads). Its response echoes the model id
//! and a checksum of the model's bytes, computed from the memory itself when it was loaded:
//!
//! ```json
//! {"model_id": "7", "checksum": "9c1f...", "size_bytes": 8388608, "input_bytes": 0}
//! ```
//!
//! Bytes are a deterministic function of the model id, so the same id always has the same
//! checksum, on any replica.

use std::collections::HashSet;
use std::io::Write as _;
use std::time::Duration;

use http::{HeaderValue, header};
use modelmux_cache::{BoxError, Model, ModelId};
use modelmux_serve::{Body, ModelKind, Request, Response};

/// How synthetic models behave. Every field has a default, so `{}` is a valid configuration.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyntheticConfig {
    /// Time a load takes, in milliseconds.
    #[serde(default)]
    pub load_ms: u64,
    /// Memory each model allocates and writes, in MiB (fractions allowed; 0 to 1,048,576).
    #[serde(default, deserialize_with = "size_mb")]
    pub size_mb: f64,
    /// Time each request takes, in milliseconds.
    #[serde(default)]
    pub infer_ms: u64,
    /// Time an unload takes, in milliseconds.
    #[serde(default)]
    pub unload_ms: u64,
    /// Ids whose load fails (a broken model).
    #[serde(default)]
    pub fail_ids: HashSet<String>,
    /// The fraction of loads that fail at random (0 to 1), after their `load_ms`: a flaky
    /// store, for soak tests of failure handling.
    #[serde(default, deserialize_with = "fraction")]
    pub fail_rate: f64,
}

fn fraction<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let x = <f64 as serde::Deserialize>::deserialize(d)?;
    if (0.0..=1.0).contains(&x) {
        Ok(x)
    } else {
        Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Float(x),
            &"a fraction from 0 to 1",
        ))
    }
}

/// Whether this load is one of the `rate` that fail: a draw from a hasher seeded at random
/// once per process, over a count of draws.
fn unlucky(rate: f64) -> bool {
    use std::hash::BuildHasher;
    use std::sync::LazyLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEED: LazyLock<std::collections::hash_map::RandomState> =
        LazyLock::new(Default::default);
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    if rate <= 0.0 {
        return false;
    }
    let draw = SEED.hash_one(DRAWS.fetch_add(1, Ordering::Relaxed));
    ((draw >> 11) as f64 / (1u64 << 53) as f64) < rate
}

fn size_mb<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    let mb = <f64 as serde::Deserialize>::deserialize(d)?;
    if mb.is_finite() && (0.0..=1_048_576.0).contains(&mb) {
        Ok(mb)
    } else {
        Err(serde::de::Error::invalid_value(
            serde::de::Unexpected::Float(mb),
            &"a size in MiB from 0 to 1048576",
        ))
    }
}

impl SyntheticConfig {
    /// The size of each model in bytes.
    pub fn size_bytes(&self) -> u64 {
        (self.size_mb.max(0.0) * (1 << 20) as f64) as u64
    }
}

/// A loaded synthetic model.
pub struct SyntheticModel {
    weights: Vec<u8>,
    checksum: u64,
    unload_ms: u64,
}

impl SyntheticModel {
    /// The checksum of its bytes.
    pub fn checksum(&self) -> u64 {
        self.checksum
    }
}

impl Model for SyntheticModel {
    fn size_bytes(&self) -> Option<u64> {
        Some(self.weights.len() as u64)
    }

    async fn unload(self) -> Result<(), BoxError> {
        if self.unload_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.unload_ms)).await;
        }
        drop(self.weights);
        Ok(())
    }
}

/// The synthetic kind.
#[derive(Debug, Clone, Default)]
pub struct Synthetic {
    config: SyntheticConfig,
}

impl Synthetic {
    /// A synthetic kind with this behaviour.
    pub fn new(config: SyntheticConfig) -> Self {
        Self { config }
    }
}

/// Writes `len` bytes that depend only on `id`, and returns them with their checksum. Fails
/// (rather than aborting the process) when the memory cannot be had.
pub fn generate(id: &str, len: usize) -> Result<(Vec<u8>, u64), std::collections::TryReserveError> {
    // FNV-1a of the id seeds a xorshift stream; the checksum folds every word written.
    let mut state = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    }) | 1;
    let mut checksum = 0u64;
    let mut weights = Vec::new();
    weights.try_reserve_exact(len)?;
    while weights.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let word = state.to_le_bytes();
        let take = (len - weights.len()).min(8);
        weights.extend_from_slice(&word[..take]);
        checksum = checksum.rotate_left(5) ^ u64::from_le_bytes(word);
    }
    Ok((weights, checksum))
}

impl ModelKind for Synthetic {
    type Model = SyntheticModel;

    async fn probe(&self, _id: &ModelId) -> Result<Option<u64>, BoxError> {
        Ok(Some(self.config.size_bytes()))
    }

    async fn load(&self, id: &ModelId) -> Result<SyntheticModel, BoxError> {
        if self.config.load_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.config.load_ms)).await;
        }
        if self.config.fail_ids.contains(id.as_str()) {
            return Err(format!("synthetic model '{id}' is configured to fail (fail_ids)").into());
        }
        if unlucky(self.config.fail_rate) {
            return Err(format!("synthetic model '{id}' failed to load (fail_rate)").into());
        }
        let len = usize::try_from(self.config.size_bytes())?;
        // Writing megabytes is CPU work: keep it off the async workers that route requests.
        let owned = id.to_string();
        let (weights, checksum) = tokio::task::spawn_blocking(move || generate(&owned, len))
            .await?
            .map_err(|e| format!("synthetic model '{id}' cannot allocate {len} bytes: {e}"))?;
        Ok(SyntheticModel {
            weights,
            checksum,
            unload_ms: self.config.unload_ms,
        })
    }

    async fn infer(
        &self,
        model: &SyntheticModel,
        id: &ModelId,
        request: Request,
    ) -> Result<Response, BoxError> {
        if self.config.infer_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.config.infer_ms)).await;
        }
        let input_bytes = request.body().as_full().map_or(0, <[u8]>::len);
        // Written straight into one buffer: through `format!` and a `serde_json::Value`, the
        // id was copied and escaped a character at a time, a visible share of a request.
        let mut body = Vec::with_capacity(96 + id.as_str().len());
        body.extend_from_slice(br#"{"model_id":"#);
        serde_json::to_writer(&mut body, id.as_str())?;
        body.extend_from_slice(br#","checksum":""#);
        for shift in (0..16).rev() {
            body.push(b"0123456789abcdef"[(model.checksum >> (4 * shift)) as usize & 0xf]);
        }
        write!(
            body,
            r#"","size_bytes":{},"input_bytes":{input_bytes}}}"#,
            model.weights.len(),
        )?;
        let mut response = Response::new(Body::from(body));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Ok(response)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_checksums_depend_only_on_the_id() {
        let (a, ca) = generate("7", 1000).unwrap();
        let (b, cb) = generate("7", 1000).unwrap();
        let (_, cc) = generate("8", 1000).unwrap();
        assert!(
            generate("huge", usize::MAX / 2).is_err(),
            "an impossible size fails, not aborts"
        );
        assert_eq!((a.len(), &a, ca), (1000, &b, cb));
        assert_ne!(ca, cc);
    }

    #[tokio::test]
    async fn loads_really_allocate_and_configured_ids_fail() {
        let kind = Synthetic::new(SyntheticConfig {
            size_mb: 0.5,
            fail_ids: ["bad".to_string()].into(),
            ..Default::default()
        });
        let m = kind.load(&ModelId::new("ok").unwrap()).await.unwrap();
        assert_eq!(m.size_bytes(), Some(512 * 1024));
        assert!(m.weights.iter().any(|&b| b != 0), "the memory was written");
        let err = kind
            .load(&ModelId::new("bad").unwrap())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("configured to fail"), "{err}");
    }

    #[tokio::test]
    async fn the_answer_is_json_naming_the_model_and_its_checksum() {
        let kind = Synthetic::new(SyntheticConfig {
            size_mb: 0.01,
            ..Default::default()
        });
        for id in ["7", "a\\b\u{e9}", "x".repeat(200).as_str()] {
            let id = ModelId::new(id).unwrap();
            let model = kind.load(&id).await.unwrap();
            let request = Request::new(Body::from("12345"));
            let response = kind.infer(&model, &id, request).await.unwrap();
            let body = response.into_body().full_bytes().unwrap();
            let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(
                json,
                serde_json::json!({
                    "model_id": id.as_str(),
                    "checksum": format!("{:016x}", model.checksum()),
                    "size_bytes": model.weights.len(),
                    "input_bytes": 5,
                })
            );
        }
    }

    #[tokio::test]
    async fn a_fail_rate_fails_about_that_fraction_of_loads() {
        let kind = Synthetic::new(SyntheticConfig {
            fail_rate: 0.1,
            ..Default::default()
        });
        let id = ModelId::new("flaky").unwrap();
        let mut failed = 0;
        for _ in 0..2000 {
            if let Err(e) = kind.load(&id).await {
                assert!(e.to_string().contains("fail_rate"), "{e}");
                failed += 1;
            }
        }
        // 200 expected; the standard deviation is 13.
        assert!((120..280).contains(&failed), "{failed} of 2000 failed");
        let never = Synthetic::default();
        for _ in 0..100 {
            assert!(never.load(&id).await.is_ok());
        }
        for bad in ["-0.1", "1.5"] {
            let err =
                serde_json::from_str::<SyntheticConfig>(&format!(r#"{{"fail_rate": {bad}}}"#))
                    .unwrap_err();
            assert!(err.to_string().contains("fraction"), "{bad}: {err}");
        }
    }

    #[test]
    fn sizes_must_be_sane() {
        for bad in ["-1", "1e300", "2000000"] {
            let err = serde_json::from_str::<SyntheticConfig>(&format!(r#"{{"size_mb": {bad}}}"#))
                .unwrap_err();
            assert!(err.to_string().contains("MiB"), "{bad}: {err}");
        }
        assert!(serde_json::from_str::<SyntheticConfig>(r#"{"size_mb": 0.5}"#).is_ok());
    }

    #[test]
    fn the_config_rejects_unknown_fields() {
        let err =
            serde_json::from_str::<SyntheticConfig>(r#"{"load_ms": 5, "size_gb": 1}"#).unwrap_err();
        assert!(err.to_string().contains("size_gb"), "{err}");
    }
}
