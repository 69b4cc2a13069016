//! A bare hyper server: every request gets "hello". It runs on the same runtime, hyper version
//! and socket options as `modelmux serve`, so the difference between the two in a benchmark
//! is the cost of modelmux itself.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::CliError;

/// Serves "hello" on `127.0.0.1:port` until the process ends.
pub async fn run(port: u16) -> Result<(), CliError> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    crate::say(format_args!(
        "hello server on http://{}\n",
        listener.local_addr()?
    ));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // Out of file descriptors and the like: back off, keep serving (as `serve` does).
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(|_request| async {
                Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                    b"hello",
                ))))
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
