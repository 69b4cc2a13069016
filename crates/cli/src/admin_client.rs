//! The admin API's client side, for `modelmux status`, `deploy` and `token`: which token to
//! use, and a server's proof that it holds that token before the token is sent.
//!
//! The token is, in order: the file `--token-file` names, `MODELMUX_ADMIN_TOKEN`, `--token`
//! (visible to every account in `ps`: warned about), else the file a server on loopback
//! wrote for its port ([`local_admin`](crate::local_admin)). Before sending it, the client
//! sends a fresh nonce with no token, and sends the token only if the answer proves that the
//! server holds it (`x-modelmux-proof`, an HMAC of the nonce keyed by the token): a process
//! that took the port of a stopped server never sees its token.

use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use modelmux_serve::{NONCE_HEADER, PROOF_HEADER};
use tokio::net::TcpStream;

use crate::CliError;

/// A token, and where it came from (for messages).
#[derive(Debug, Clone)]
pub struct AdminToken {
    /// The token.
    pub token: String,
    /// Where it came from: `MODELMUX_ADMIN_TOKEN`, `--token`, or a file.
    pub source: String,
}

/// What the command line says of the token.
#[derive(Debug, Default, clap::Args)]
pub struct TokenFlags {
    /// A file holding the admin token (default: MODELMUX_ADMIN_TOKEN, else the file a server
    /// on loopback wrote for its port, see `modelmux token`).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// The admin token itself (deprecated: every account sees it in `ps`; use --token-file or
    /// MODELMUX_ADMIN_TOKEN).
    #[arg(long)]
    pub token: Option<String>,
}

impl TokenFlags {
    /// The token to use with the server at `url`, if any.
    pub fn resolve(&self, url: &str) -> Result<Option<AdminToken>, CliError> {
        if let Some(path) = &self.token_file {
            let token = crate::local_admin::read_file(path)?;
            return Ok(Some(AdminToken {
                token,
                source: path.display().to_string(),
            }));
        }
        if let Some(token) = std::env::var("MODELMUX_ADMIN_TOKEN")
            .ok()
            .filter(|t| !t.is_empty())
        {
            return Ok(Some(AdminToken {
                token,
                source: "MODELMUX_ADMIN_TOKEN".into(),
            }));
        }
        if let Some(token) = &self.token {
            eprintln!(
                "warning: --token is visible to every account of this machine (ps); use \
                 --token-file FILE or MODELMUX_ADMIN_TOKEN"
            );
            return Ok(Some(AdminToken {
                token: token.clone(),
                source: "--token".into(),
            }));
        }
        let addr = parse_url(url)?;
        if !addr.ip().is_loopback() {
            return Ok(None);
        }
        Ok(match crate::local_admin::read_for_port(addr.port())? {
            Ok((path, token)) => Some(AdminToken {
                token,
                source: path.display().to_string(),
            }),
            Err(_) => None,
        })
    }
}

/// The token file of this account's server at `url` (loopback only), checked: `modelmux
/// token`'s answer.
pub fn local_token(url: &str) -> Result<(PathBuf, String), CliError> {
    let addr = parse_url(url)?;
    if !addr.ip().is_loopback() {
        return Err(
            format!("{url} is not on loopback: only local servers write a token file").into(),
        );
    }
    match crate::local_admin::read_for_port(addr.port())? {
        Ok(found) => Ok(found),
        Err(path) => Err(format!(
            "no token file {} (a server on port {} started by this account without \
             http_options.admin_token writes it)",
            path.display(),
            addr.port()
        )
        .into()),
    }
}

/// An answer: its status and body.
pub struct Answer {
    /// The status.
    pub status: u16,
    /// The body.
    pub body: Bytes,
}

/// `method path` to the server at `url`, with `token` only once the server proved it holds
/// it; a JSON body (with its content type) when `json` is given.
pub async fn call(
    url: &str,
    method: http::Method,
    path: &str,
    token: Option<&AdminToken>,
    json: Option<&serde_json::Value>,
) -> Result<Answer, CliError> {
    let send_token = match token {
        Some(token) => proves(url, &token.token).await?,
        None => false,
    };
    let mut request = http::Request::builder().method(method).uri(path);
    if let (true, Some(token)) = (send_token, token) {
        request = request.header("authorization", format!("Bearer {}", token.token));
    }
    let body = match json {
        Some(value) => {
            request = request.header("content-type", "application/json");
            Bytes::from(serde_json::to_vec(value)?)
        }
        None => Bytes::new(),
    };
    let (status, _, body) = send(url, request, body).await?;
    if let (false, Some(token), 401 | 403) = (send_token, token, status) {
        return Err(format!(
            "{url}{path} answered {status}, and the admin token from {} was not sent: the \
             server did not prove that it holds it (another process on that port, or a stale \
             token?)",
            token.source
        )
        .into());
    }
    Ok(Answer { status, body })
}

/// Whether the server at `url` proves that it holds `token`, asked with no token.
async fn proves(url: &str, token: &str) -> Result<bool, CliError> {
    let nonce = crate::local_admin::hex(&crate::local_admin::random::<16>()?);
    let request = http::Request::get("/-/healthz").header(NONCE_HEADER, &nonce);
    let (_, headers, _) = send(url, request, Bytes::new()).await?;
    Ok(headers
        .get(PROOF_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proof| modelmux_serve::proof_matches(token, &nonce, proof)))
}

async fn send(
    url: &str,
    request: http::request::Builder,
    body: Bytes,
) -> Result<(u16, http::HeaderMap, Bytes), CliError> {
    let addr = parse_url(url)?;
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let (mut sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = request.header("host", addr.to_string());
    let response = sender.send_request(request.body(Full::new(body))?).await?;
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    Ok((
        status,
        headers,
        response.into_body().collect().await?.to_bytes(),
    ))
}

fn parse_url(url: &str) -> Result<SocketAddr, CliError> {
    crate::bench::parse_url(url)
}
