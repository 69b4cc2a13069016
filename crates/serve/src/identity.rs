//! A server proving that it holds the admin token, without revealing it: a client sends a
//! fresh random nonce in [`NONCE_HEADER`], and the admin API answers (whatever the request's
//! status, and whether or not it carried the token) with [`PROOF_HEADER`], the hex
//! HMAC-SHA256 of the nonce keyed by the token. A client that holds the token checks it before
//! it sends the token or reads anything of the answer: a process that took the server's port
//! cannot make the proof, and learns nothing from a nonce. The Python driver checks it on every
//! answer before it unpickles one; `modelmux status` and `deploy` before they send the token.

use sha2::{Digest, Sha256};

/// The request header that carries a client's nonce: 16 to 128 characters of `A-Z a-z 0-9 - _`.
pub const NONCE_HEADER: &str = "x-modelmux-nonce";

/// The answer's header with the proof: 64 lower-case hex digits of
/// HMAC-SHA256(token, `"modelmux-proof-v1\n"` + nonce).
pub const PROOF_HEADER: &str = "x-modelmux-proof";

/// Kept apart from any other use of the token as a key.
const CONTEXT: &[u8] = b"modelmux-proof-v1\n";

/// Whether `nonce` is one a client may send: 16 to 128 characters of `A-Z a-z 0-9 - _`.
pub(crate) fn valid_nonce(nonce: &[u8]) -> bool {
    (16..=128).contains(&nonce.len())
        && nonce
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
}

/// The proof of holding `token` for `nonce`: 64 lower-case hex digits.
pub fn identity_proof(token: &str, nonce: &str) -> String {
    let mac = hmac_sha256(token.as_bytes(), &[CONTEXT, nonce.as_bytes()]);
    let mut hex = String::with_capacity(64);
    for byte in mac {
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
        hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
    }
    hex
}

/// Whether `proof` is the proof of holding `token` for `nonce`, compared in time that does not
/// depend on where they differ.
pub fn proof_matches(token: &str, nonce: &str, proof: &str) -> bool {
    let expected = identity_proof(token, nonce);
    if proof.len() != expected.len() {
        return false;
    }
    let diff = expected
        .bytes()
        .zip(proof.bytes())
        .fold(0u8, |diff, (a, b)| std::hint::black_box(diff | (a ^ b)));
    diff == 0
}

/// HMAC-SHA256 (RFC 2104) of the concatenated `message` parts.
fn hmac_sha256(key: &[u8], message: &[&[u8]]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|b| b ^ byte);
    let mut inner = Sha256::new();
    inner.update(pad(0x36));
    for part in message {
        inner.update(part);
    }
    let mut outer = Sha256::new();
    outer.update(pad(0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn hmac_sha256_gives_rfc_4231s_values() {
        // Test cases 1, 2 and 6 (a key longer than the block).
        let cases: [(&[u8], &[u8], &str); 3] = [
            (
                &[0x0b; 20],
                b"Hi There",
                "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
            ),
            (
                b"Jefe",
                b"what do ya want for nothing?",
                "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
            ),
            (
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First",
                "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
            ),
        ];
        for (key, data, want) in cases {
            let (a, b) = data.split_at(3);
            assert_eq!(hex(&hmac_sha256(key, &[a, b])), want);
        }
    }

    #[test]
    fn proofs_match_only_for_the_same_token_and_nonce() {
        let proof = identity_proof("s3cret", "nonce-0123456789abcdef");
        // What Python's `hmac.new(token, b"modelmux-proof-v1\n" + nonce, "sha256")` gives
        // (the driver's side, `python/modelmux/_api/client.py`).
        assert_eq!(
            proof,
            "5c635c3ada0b7d96056a32578d55c3374f2df1b6e6eb64c4ee7a6ebd42f6a647"
        );
        assert!(proof_matches("s3cret", "nonce-0123456789abcdef", &proof));
        assert!(!proof_matches("s3cres", "nonce-0123456789abcdef", &proof));
        assert!(!proof_matches("s3cret", "nonce-0123456789abcdeg", &proof));
        assert!(!proof_matches(
            "s3cret",
            "nonce-0123456789abcdef",
            &proof[..63]
        ));
        assert!(!proof_matches("s3cret", "nonce-0123456789abcdef", ""));
    }

    #[test]
    fn nonces_are_short_plain_strings() {
        assert!(valid_nonce(b"0123456789abcdef"));
        assert!(valid_nonce(&[b'a'; 128]));
        assert!(!valid_nonce(b"0123456789abcde"));
        assert!(!valid_nonce(&[b'a'; 129]));
        assert!(!valid_nonce(b"0123456789abcdef\n"));
        assert!(!valid_nonce("0123456789abcdeé".as_bytes()));
    }
}
