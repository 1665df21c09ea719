//! The metrics endpoint's HTTP server, and what both servers do when `accept` fails.
//!
//! Scrapes are served on a thread of their own (with its own small runtime), so neither
//! rendering nor a slow or stuck client can delay the control tick. At most [`MAX_SCRAPES`]
//! connections at a time, one request each, and each gets [`SCRAPE_LIMIT`] to send its request
//! and take the answer. A new connection over the cap closes the oldest one, so clients that
//! connect and say nothing cannot lock out a scrape (which takes milliseconds). The limit sits
//! below Prometheus' default scrape timeout (10 s).

use std::{
    collections::VecDeque,
    io,
    net::SocketAddr,
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{body::Bytes, server::conn::http1, service::service_fn, Request, Response};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinHandle};
use tracing::{debug, warn};

use super::metrics::{text, Metrics};

pub const MAX_SCRAPES: usize = 16;
pub const SCRAPE_LIMIT: Duration = Duration::from_secs(5);

/// Backs off after a failed `accept` (EMFILE and ENFILE fail at once, again and again, while
/// the connection waits in the backlog): 5 ms doubling to 1 s, as Go's net/http does, and one
/// log line per 10 s with the count of the others.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    delay: Duration,
    logged: Option<Instant>,
    unlogged: u64,
}

impl AcceptBackoff {
    const FIRST: Duration = Duration::from_millis(5);
    const MAX: Duration = Duration::from_secs(1);
    const LOG_EVERY: Duration = Duration::from_secs(10);

    pub fn ok(&mut self) {
        self.delay = Duration::ZERO;
    }

    /// The delay before the next accept, logging if it is time to.
    pub fn failed(&mut self, what: &str, e: &io::Error, now: Instant) -> Duration {
        self.delay = (self.delay * 2).clamp(Self::FIRST, Self::MAX);
        if self.logged.is_none_or(|t| now.saturating_duration_since(t) >= Self::LOG_EVERY) {
            let more = std::mem::take(&mut self.unlogged);
            warn!(
                "{what}: accept: {e} ({more} more failures since the last line); retrying in {:?}",
                self.delay
            );
            self.logged = Some(now);
        } else {
            self.unlogged += 1;
        }
        self.delay
    }
}

/// Binds the metrics address (before any side effect, so a taken one is a clear error).
pub fn bind(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("metrics address {addr}: {e}"))?;
    l.set_nonblocking(true).map_err(|e| anyhow::anyhow!("metrics address {addr}: {e}"))?;
    Ok(l)
}

/// Serves `GET /metrics` (anything else: 404) on its own thread until the process exits.
pub fn spawn(listener: std::net::TcpListener, metrics: Metrics) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| anyhow::anyhow!("the metrics server's runtime: {e}"))?;
    std::thread::Builder::new()
        .name("lp-metrics".into())
        .spawn(move || {
            rt.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(l) => serve(l, metrics).await,
                    Err(e) => warn!("metrics: {e}; no metrics served"),
                }
            })
        })
        .map_err(|e| anyhow::anyhow!("starting the metrics thread: {e}"))?;
    Ok(())
}

async fn serve(listener: TcpListener, metrics: Metrics) {
    let mut open: VecDeque<JoinHandle<()>> = VecDeque::new();
    let mut backoff = AcceptBackoff::default();
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tokio::time::sleep(backoff.failed("metrics", &e, Instant::now())).await;
                continue;
            }
        };
        backoff.ok();
        open.retain(|c| !c.is_finished());
        if open.len() >= MAX_SCRAPES {
            // Aborting the task drops its socket.
            if let Some(oldest) = open.pop_front() {
                oldest.abort();
            }
            debug!(%peer, "metrics: {MAX_SCRAPES} connections open; closed the oldest");
        }
        let m = metrics.clone();
        open.push_back(tokio::spawn(async move {
            let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                let m = m.clone();
                async move { Ok::<_, std::convert::Infallible>(respond(&m, &req)) }
            });
            let conn =
                http1::Builder::new().keep_alive(false).serve_connection(TokioIo::new(stream), svc);
            match tokio::time::timeout(SCRAPE_LIMIT, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, "metrics connection: {e}"),
                Err(_) => debug!(%peer, "metrics connection: closed after {SCRAPE_LIMIT:?}"),
            }
        }));
    }
}

fn respond(m: &Metrics, req: &Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
    let (status, ctype, body) = if req.uri().path() == "/metrics" {
        let accept = req.headers().get(hyper::header::ACCEPT).and_then(|a| a.to_str().ok());
        if text::wants_openmetrics(accept) {
            (200, text::OPENMETRICS, m.render())
        } else {
            (200, text::CONTENT_TYPE, text::classic(&m.render()))
        }
    } else {
        (404, "text/plain", "not found: metrics are at /metrics\n".to_owned())
    };
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_errors_back_off_to_a_second() {
        let mut b = AcceptBackoff::default();
        let e = io::Error::from_raw_os_error(libc::EMFILE);
        let now = Instant::now();
        let delays: Vec<_> = (0..10).map(|_| b.failed("t", &e, now).as_millis()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(b.unlogged, 9, "one line per 10 s");
        b.failed("t", &e, now + AcceptBackoff::LOG_EVERY);
        assert_eq!(b.unlogged, 0);
        b.ok();
        assert_eq!(b.failed("t", &e, now).as_millis(), 5, "starts over after a success");
    }
}
