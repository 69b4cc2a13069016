//! What error messages may not tell a client: where files live on the server, and secrets in
//! URLs. The full message still goes to the server's log; the client's copy is redacted here,
//! in the one place error bodies are made, so no runtime or loader has to remember to.
//!
//! - A local absolute path (`/var/models/acme/model.onnx`) keeps only its last component:
//!   `…/model.onnx`, enough to tell which file without showing the layout.
//! - Credentials in a URL (`https://user:pass@host/...`) become `https://***@host/...`.
//! - Query values of signing and credential parameters (`X-Amz-Signature`, `X-Amz-Credential`,
//!   `token`, `key`, `secret`, `password`, `sig`, ...) become `***`.
//!
//! URLs keep their paths (`s3://bucket/key`, `https://host/path`): they name remote objects
//! the client's own configuration names.

/// Characters after which a `/` starts a local path (not the middle of a URL or a word).
fn starts_path(previous: Option<char>) -> bool {
    match previous {
        None => true,
        Some(c) => c.is_whitespace() || matches!(c, '\'' | '"' | '`' | '(' | '[' | '=' | ','),
    }
}

/// Where a path or URL token ends.
fn ends_token(c: char) -> bool {
    c.is_whitespace() || matches!(c, '\'' | '"' | '`' | ')' | ']' | ',' | ';')
}

const SECRET_PARAMS: [&str; 10] = [
    "x-amz-signature",
    "x-amz-credential",
    "x-amz-security-token",
    "signature",
    "sig",
    "token",
    "access_token",
    "key",
    "secret",
    "password",
];

/// The message with local paths shortened and URL secrets hidden.
pub(crate) fn redact(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    let mut previous: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        // Trailing punctuation ends a sentence, not the path or URL.
        let token_len = rest.find(ends_token).unwrap_or(rest.len());
        let token = rest[..token_len].trim_end_matches([':', '.', ';', ',']);
        let token_len = token.len().max(c.len_utf8());
        if c == '/' && starts_path(previous) && token.len() > 1 && !token.starts_with("//") {
            out.push_str(&shorten_path(token));
            rest = &rest[token_len..];
            previous = token.chars().last();
            continue;
        }
        if starts_path(previous)
            && let Some(scheme_end) = token.find("://")
            && token[..scheme_end]
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            && scheme_end > 0
        {
            out.push_str(&redact_url(token, scheme_end));
            rest = &rest[token_len..];
            previous = token.chars().last();
            continue;
        }
        out.push(c);
        previous = Some(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `/a/b/c.bin` → `…/c.bin`; a path of one component stays (it shows no layout).
fn shorten_path(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rsplit_once('/') {
        Some((dir, last)) if !dir.is_empty() => format!("…/{last}"),
        _ => path.to_owned(),
    }
}

fn redact_url(url: &str, scheme_end: usize) -> String {
    let (scheme, after) = (&url[..scheme_end], &url[scheme_end + 3..]);
    if scheme.eq_ignore_ascii_case("file") {
        return format!("file://{}", shorten_path(after));
    }
    let authority_end = after.find(['/', '?', '#']).unwrap_or(after.len());
    let (authority, tail) = after.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("***@{host}"),
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((name, _))
                        if SECRET_PARAMS.contains(&name.to_ascii_lowercase().as_str()) =>
                    {
                        format!("{name}=***")
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn local_paths_keep_only_their_last_component() {
        assert_eq!(
            redact("model 'x' not found in /var/lib/models/acme (no such file)"),
            "model 'x' not found in …/acme (no such file)"
        );
        assert_eq!(
            redact("cannot open '/root/.cache/m/adapter_model.safetensors': denied"),
            "cannot open '…/adapter_model.safetensors': denied"
        );
        assert_eq!(redact("path=/srv/a/b.gguf"), "path=…/b.gguf");
        assert_eq!(redact("missing: /srv/a/b.gguf."), "missing: …/b.gguf.");
        assert_eq!(redact("file:///srv/a/b.gguf"), "file://…/b.gguf");
        // Not paths: a lone slash, a ratio, a one-component name.
        assert_eq!(redact("3/4 of / is /tmp"), "3/4 of / is /tmp");
    }

    #[test]
    fn urls_keep_their_path_and_lose_their_secrets() {
        assert_eq!(
            redact("GET s3://bucket/models/a.onnx failed"),
            "GET s3://bucket/models/a.onnx failed"
        );
        assert_eq!(
            redact(
                "fetching https://user:hunter2@host.example/m/a.bin?X-Amz-Signature=abc&part=1&token=t0k: 403"
            ),
            "fetching https://***@host.example/m/a.bin?X-Amz-Signature=***&part=1&token=***: 403"
        );
        assert_eq!(redact("no secrets here, bye"), "no secrets here, bye");
        assert_eq!(redact("ünïcödé /a/b ok"), "ünïcödé …/b ok");
    }
}
