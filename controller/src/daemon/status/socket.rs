//! The status socket's two ends: the daemon's server and the CLI's client. The socket (mode
//! 0600) answers one request line with one JSON line, to root or the daemon's own user only:
//! the mode keeps others out and the peer's credentials are checked as well, since the
//! directory's permissions are not ours to trust. Separate from the reply's shape
//! (`status.rs`) and its table (`render.rs`): this is the only part that touches sockets.
//!
//! The server runs on a thread of its own, with its own small runtime: the control loop's work
//! is synchronous (loading the programs, a tick), and a server sharing its runtime would leave
//! clients unanswered for as long as that work takes, which on a loaded node outlasts the
//! client's timeout.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{
        fs::PermissionsExt,
        net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream},
    },
    path::Path,
    thread::JoinHandle,
    time::Duration,
};

use anyhow::Context;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader},
    net::UnixListener,
    sync::oneshot,
};
use tracing::{debug, warn};

use super::{Shared, Status};
use crate::daemon::status_request::{reply, MAX_REQUEST, REFUSED};

/// Creates the socket (replacing a stale one, never a live one, and nothing that is not a
/// socket), readable and writable by the owner only.
pub fn bind(path: &Path) -> anyhow::Result<StdUnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("checking {}", path.display())),
        // Only a socket of ours may be replaced: a file, link or directory someone put there
        // is theirs.
        Ok(m) if !m.file_type().is_socket() => anyhow::bail!(
            "{}: exists and is not a socket (a {}); remove it or pass --status-socket",
            path.display(),
            if m.file_type().is_symlink() {
                "symbolic link"
            } else if m.is_dir() {
                "directory"
            } else {
                "file"
            }
        ),
        // A socket someone answers on is a running daemon's (a dry run takes no lock).
        Ok(_) if StdUnixStream::connect(path).is_ok() => anyhow::bail!(
            "{}: another linkpilot answers there; pass --status-socket",
            path.display()
        ),
        Ok(_) => std::fs::remove_file(path)
            .with_context(|| format!("removing the stale {}", path.display()))?,
    }
    let listener =
        StdUnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    listener
        .set_nonblocking(true)
        .with_context(|| format!("making {} non-blocking", path.display()))?;
    Ok(listener)
}

/// The server's thread; [`Server::stop`] (or dropping it) ends it and closes the listener.
pub struct Server {
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// Serves `listener` on a thread of its own until stopped.
pub fn spawn(listener: StdUnixListener, shared: Shared) -> anyhow::Result<Server> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the status server's runtime")?;
    let (stop, stopped) = oneshot::channel();
    let thread = std::thread::Builder::new()
        .name("lp-status".into())
        .spawn(move || {
            rt.block_on(async move {
                match UnixListener::from_std(listener) {
                    Ok(l) => tokio::select! {
                        () = serve(l, shared) => {}
                        _ = stopped => {}
                    },
                    Err(e) => warn!("status socket: {e}; no status served"),
                }
            });
        })
        .context("starting the status thread")?;
    Ok(Server { stop: Some(stop), thread: Some(thread) })
}

impl Server {
    pub fn stop(mut self) {
        self.shut();
    }

    fn shut(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut();
    }
}

/// Answers requests until the task is dropped: one line each, as `status_request::reply`
/// decides.
async fn serve(listener: UnixListener, shared: Shared) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut backoff = crate::daemon::serve::AcceptBackoff::default();
    loop {
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                let delay = backoff.failed("status", &e, std::time::Instant::now());
                tokio::time::sleep(delay).await;
                continue;
            }
        };
        backoff.ok();
        let allowed = stream.peer_cred().is_ok_and(|c| c.uid() == 0 || c.uid() == me);
        let shared = shared.clone();
        tokio::spawn(async move {
            let (r, mut w) = stream.into_split();
            let answer = if !allowed {
                warn!("status: refused a client that is not root");
                REFUSED.to_owned()
            } else {
                let mut line = Vec::new();
                let limit = MAX_REQUEST as u64 + 1;
                let read = tokio::time::timeout(
                    Duration::from_secs(2),
                    TokioBufReader::new(r.take(limit)).read_until(b'\n', &mut line),
                )
                .await;
                if !matches!(read, Ok(Ok(_))) {
                    return;
                }
                reply(&line, || shared.lock().map(|s| s.clone()).unwrap_or_default())
            };
            // A client that does not read its reply is not kept waiting for.
            let line = format!("{answer}\n");
            let write = w.write_all(line.as_bytes());
            match tokio::time::timeout(Duration::from_secs(2), write).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!("status reply: {e}"),
                Err(_) => debug!("status reply: the client did not read it within 2 s"),
            }
        });
    }
}

/// Asks a running daemon (blocking; the CLI's side).
pub fn query(path: &Path) -> anyhow::Result<Status> {
    let mut s = StdUnixStream::connect(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                "is `linkpilot run` running?"
            }
            std::io::ErrorKind::PermissionDenied => "the status API is root-only",
            _ => "",
        };
        anyhow::anyhow!("{}: {e} ({hint})", path.display())
    })?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    // A client the daemon refuses is answered and closed without being read, so the request
    // can meet a closed socket (EPIPE) while the refusal waits to be read: read it either way.
    let sent = s.write_all(b"status\n");
    let mut line = String::new();
    let read = BufReader::new(&s).read_line(&mut line);
    if line.is_empty() {
        sent.with_context(|| format!("{}: sending the request", path.display()))?;
    }
    read.context("reading the status reply")?;
    if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
        if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
            anyhow::bail!("{}: {e}", path.display());
        }
    }
    serde_json::from_str(&line).with_context(|| format!("{}: not a status reply", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bind_replaces_only_a_stale_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.sock");
        // A stale socket (its listener gone) is replaced; a live one is refused.
        drop(bind(&path).unwrap());
        let live = bind(&path).unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("another linkpilot answers there"), "{e}");
        drop(live);
        std::fs::remove_file(&path).unwrap();
        // A regular file or a symlink at the path is someone else's: refused, left alone.
        std::fs::write(&path, "data").unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("exists and is not a socket (a file)"), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "data");
        std::fs::remove_file(&path).unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, "data").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let e = bind(&path).unwrap_err().to_string();
        assert!(e.contains("not a socket (a symbolic link)"), "{e}");
        assert!(std::fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    }
}
