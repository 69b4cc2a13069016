//! The access line of a request whose path holds characters a terminal acts on (security
//! review T5-12): C1 controls such as U+009B (an 8-bit CSI), U+2028 and bidi overrides reach
//! the server raw (httparse passes bytes of 0x80 and above in a path) and must be escaped in
//! the line, in both formats.

use std::net::SocketAddr;
use std::sync::Arc;

use modelmux_front::{AccessFormat, AccessSink, Server};
use modelmux_serve::Application;
use modelmux_types::is_unsafe_in_text;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::echo;

#[derive(Default)]
struct Lines(Mutex<Vec<String>>);

impl AccessSink for Lines {
    fn write_line(&self, line: &[u8]) {
        self.0
            .lock()
            .push(String::from_utf8_lossy(line).into_owned());
    }
}

/// The review's probe: a path that, printed raw, turns the terminal red (`ESC [` spelled as
/// U+009B), breaks the line (U+2028) to forge a second one, and reverses what follows (U+202E).
const PATH: &[u8] = b"/\xc2\x9b31mX\xe2\x80\xa8INFO_fake\xe2\x80\xaeetc\xc2\x85\xe2\x81\xa6x";

#[tokio::test(flavor = "current_thread")]
async fn a_path_with_c1_controls_separators_and_bidi_overrides_is_logged_escaped() {
    // Access lines are written only while `modelmux::access` is enabled at INFO; a
    // current-thread runtime keeps every task under this thread's subscriber.
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::sink)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    for format in [AccessFormat::Text, AccessFormat::Json] {
        let lines = Arc::new(Lines::default());
        let server = Server::builder()
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .access_log(format, lines.clone())
            .application(Application::new("a").ingress(echo("Echo")))
            .start()
            .await
            .unwrap();
        let mut stream = TcpStream::connect(server.local_addr()).await.unwrap();
        let request = [
            &b"GET "[..],
            PATH,
            b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        ]
        .concat();
        stream.write_all(&request).await.unwrap();
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await.unwrap();
        assert!(response.starts_with(b"HTTP/1.1 200"), "{response:?}");

        let line = lines.0.lock().first().cloned().expect("an access line");
        let path = std::str::from_utf8(PATH).unwrap();
        let raw: Vec<char> = line.chars().filter(|&c| is_unsafe_in_text(c)).collect();
        assert_eq!(raw, ['\n'], "{format:?} wrote raw: {line:?}");
        match format {
            AccessFormat::Text => {
                assert!(line.contains(&format!(" path={path:?} ")), "{line}");
                assert!(
                    line.contains(r"\u{9b}31mX\u{2028}INFO_fake\u{202e}"),
                    "{line}"
                );
            }
            AccessFormat::Json => {
                let parsed: serde_json::Value = serde_json::from_str(&line).unwrap();
                assert_eq!(parsed["fields"]["path"], path, "{line}");
                assert!(line.contains(r"\u009b31mX\u2028INFO_fake\u202e"), "{line}");
            }
        }
        server.shutdown().await;
    }
}
