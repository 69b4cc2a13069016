//! vLLM's `/v1/score` and `/v1/rerank`, computed from the embeddings the deployment already
//! makes (`/v1/embeddings`: the mean-pooled last hidden state): a score is the cosine
//! similarity of two texts' embeddings. (vLLM scores with a cross-encoder when the model is
//! one; SmolLM2-class chat models are not, and an embedding model served here scores the
//! way it embeds.)

use serde::Deserialize;
use serde_json::{Value, json};

use crate::params::{invalid, parse_body};
use crate::protocol::OneOrMany;
use modelmux_serve::ServeError;

/// Most texts one request may score.
const MAX_TEXTS: usize = 256;

/// `POST /v1/score`: `text_1` against each of `text_2` (one and many), or pairwise (as many
/// as each other).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScoreRequest {
    model: String,
    text_1: OneOrMany<String>,
    text_2: OneOrMany<String>,
    #[allow(dead_code)] // accepted: an end-user id for the caller's own accounting
    user: Option<String>,
}

/// `POST /v1/rerank`: documents ordered by their score against the query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RerankRequest {
    model: String,
    query: String,
    documents: Vec<String>,
    top_n: Option<usize>,
    return_documents: Option<bool>,
    #[allow(dead_code)] // accepted: an end-user id for the caller's own accounting
    user: Option<String>,
}

/// One text or many.
fn texts(input: OneOrMany<String>) -> Vec<String> {
    match input {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    }
}

/// What to answer with the scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScoreShape {
    /// vLLM's score list, one entry per pair.
    Score,
    /// vLLM's (Jina/Cohere-shaped) rerank results, best first, `top_n` of them.
    Rerank {
        /// How many results to return.
        top_n: usize,
        /// Whether each result carries its document's text.
        return_documents: bool,
    },
}

/// A scoring request, checked: the texts to embed and which pairs to score.
#[derive(Debug)]
pub(crate) struct ScoreJob {
    pub(crate) model: String,
    pub(crate) shape: ScoreShape,
    /// Every text, each embedded once.
    pub(crate) texts: Vec<String>,
    /// Pairs of indices into `texts`, in the answer's order (before a rerank sorts them).
    pub(crate) pairs: Vec<(usize, usize)>,
}

fn check_texts(param: &str, texts: &[String]) -> Result<(), ServeError> {
    if texts.is_empty() {
        return Err(invalid(
            param,
            format!("{param} must hold at least one text"),
        ));
    }
    if texts.iter().any(String::is_empty) {
        return Err(invalid(param, format!("{param}: a text is empty")));
    }
    Ok(())
}

/// Parses `/v1/score`.
pub(crate) fn parse_score(body: &[u8]) -> Result<ScoreJob, ServeError> {
    let r: ScoreRequest = parse_body(body)?;
    let (first, second) = (texts(r.text_1), texts(r.text_2));
    check_texts("text_1", &first)?;
    check_texts("text_2", &second)?;
    let pairs: Vec<(usize, usize)> = match (first.len(), second.len()) {
        (1, n) => (0..n).map(|j| (0, 1 + j)).collect(),
        (m, n) if m == n => (0..n).map(|i| (i, m + i)).collect(),
        (m, n) => {
            return Err(invalid(
                "text_2",
                format!(
                    "text_1 holds {m} texts and text_2 {n}: give one text_1, or as many as text_2"
                ),
            ));
        }
    };
    let texts: Vec<String> = first.into_iter().chain(second).collect();
    if texts.len() > MAX_TEXTS {
        return Err(invalid(
            "text_2",
            format!("at most {MAX_TEXTS} texts per request, got {}", texts.len()),
        ));
    }
    Ok(ScoreJob {
        model: r.model,
        shape: ScoreShape::Score,
        texts,
        pairs,
    })
}

/// Parses `/v1/rerank`.
pub(crate) fn parse_rerank(body: &[u8]) -> Result<ScoreJob, ServeError> {
    let r: RerankRequest = parse_body(body)?;
    if r.query.is_empty() {
        return Err(invalid("query", "query is empty"));
    }
    check_texts("documents", &r.documents)?;
    if r.documents.len() + 1 > MAX_TEXTS {
        return Err(invalid(
            "documents",
            format!(
                "at most {} documents per request, got {}",
                MAX_TEXTS - 1,
                r.documents.len()
            ),
        ));
    }
    let n = r.documents.len();
    let top_n = match r.top_n {
        Some(0) => return Err(invalid("top_n", "top_n must be at least 1")),
        Some(k) => k.min(n),
        None => n,
    };
    Ok(ScoreJob {
        model: r.model,
        shape: ScoreShape::Rerank {
            top_n,
            return_documents: r.return_documents.unwrap_or(true),
        },
        texts: std::iter::once(r.query).chain(r.documents).collect(),
        pairs: (0..n).map(|j| (0, 1 + j)).collect(),
    })
}

/// The cosine similarity of `a` and `b` (0 when either is all zeros).
pub(crate) fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        dot += *x as f64 * *y as f64;
        aa += *x as f64 * *x as f64;
        bb += *y as f64 * *y as f64;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (dot / (aa.sqrt() * bb.sqrt())) as f32
}

/// The answer for `job`, given each text's embedding and the prompt tokens used.
pub(crate) fn answer(
    job: &ScoreJob,
    request_id: &str,
    embeddings: &[Vec<f32>],
    tokens: usize,
) -> Value {
    let scores: Vec<f32> = job
        .pairs
        .iter()
        .map(|&(a, b)| cosine(&embeddings[a], &embeddings[b]))
        .collect();
    match job.shape {
        ScoreShape::Score => json!({
            "id": format!("score-{request_id}"),
            "object": "list",
            "created": crate::protocol::unix_now(),
            "model": job.model,
            "data": scores.iter().enumerate().map(|(index, score)| json!({
                "index": index, "object": "score", "score": score,
            })).collect::<Vec<_>>(),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }),
        ScoreShape::Rerank {
            top_n,
            return_documents,
        } => {
            let mut order: Vec<usize> = (0..scores.len()).collect();
            // Best first; ties keep the documents' order.
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            let results: Vec<Value> = order
                .into_iter()
                .take(top_n)
                .map(|index| {
                    let mut result = json!({"index": index, "relevance_score": scores[index]});
                    if return_documents {
                        result["document"] = json!({"text": job.texts[1 + index]});
                    }
                    result
                })
                .collect();
            json!({
                "id": format!("rerank-{request_id}"),
                "model": job.model,
                "usage": {"total_tokens": tokens},
                "results": results,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_become_pairs_and_bad_ones_name_the_field() {
        let one = parse_score(br#"{"model": "m", "text_1": "q", "text_2": ["a", "b"]}"#).unwrap();
        assert_eq!(one.pairs, [(0, 1), (0, 2)]);
        let pairwise =
            parse_score(br#"{"model": "m", "text_1": ["q", "r"], "text_2": ["a", "b"]}"#).unwrap();
        assert_eq!(pairwise.pairs, [(0, 2), (1, 3)]);
        let rerank = parse_rerank(
            br#"{"model": "m", "query": "q", "documents": ["a", "b", "c"], "top_n": 9}"#,
        )
        .unwrap();
        assert_eq!(rerank.pairs, [(0, 1), (0, 2), (0, 3)]);
        assert_eq!(
            rerank.shape,
            ScoreShape::Rerank {
                top_n: 3,
                return_documents: true
            }
        );
        for (body, param) in [
            (
                r#"{"model": "m", "text_1": ["q", "r"], "text_2": ["a", "b", "c"]}"#,
                "text_2",
            ),
            (r#"{"model": "m", "text_1": "", "text_2": "a"}"#, "text_1"),
            (r#"{"model": "m", "text_1": "q", "text_2": []}"#, "text_2"),
        ] {
            match parse_score(body.as_bytes()) {
                Err(ServeError::InvalidParameter { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{body}: {other:?}"),
            }
        }
        for (body, param) in [
            (
                r#"{"model": "m", "query": "q", "documents": []}"#,
                "documents",
            ),
            (
                r#"{"model": "m", "query": "q", "documents": ["a"], "top_n": 0}"#,
                "top_n",
            ),
        ] {
            match parse_rerank(body.as_bytes()) {
                Err(ServeError::InvalidParameter { param: p, .. }) => assert_eq!(p, param),
                other => panic!("{body}: {other:?}"),
            }
        }
    }

    #[test]
    fn reranking_orders_by_cosine_and_keeps_top_n() {
        let job = parse_rerank(
            br#"{"model": "m", "query": "q", "documents": ["a", "b", "c"], "top_n": 2}"#,
        )
        .unwrap();
        let embeddings = vec![
            vec![1.0, 0.0],
            vec![0.0, 1.0],  // a: 0
            vec![1.0, 1.0],  // b: 0.707
            vec![2.0, 0.01], // c: ~1
        ];
        let answer = answer(&job, "r1", &embeddings, 7);
        let results = answer["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 2);
        assert_eq!(results[0]["document"]["text"], "c");
        assert_eq!(results[1]["index"], 1);
        let s = results[1]["relevance_score"].as_f64().unwrap();
        assert!((s - std::f64::consts::FRAC_1_SQRT_2).abs() < 1e-6, "{s}");
        assert_eq!(answer["usage"]["total_tokens"], 7);
    }
}
