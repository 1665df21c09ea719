//! The status socket's two ends: the daemon's server and the CLI's client. The socket (mode
//! 0600) answers one request line with one JSON line, to root or the daemon's own user only:
//! the mode keeps others out and the peer's credentials are checked as well, since the
//! directory's permissions are not ours to trust. Separate from the reply's shape
//! (`status.rs`) and its table (`render.rs`): this is the only part that touches sockets.

use std::{
    io::{BufRead, BufReader, Write},
    os::unix::{fs::PermissionsExt, net::UnixStream as StdUnixStream},
    path::Path,
    time::Duration,
};

use anyhow::Context;
use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader as TokioBufReader},
    net::UnixListener,
};
use tracing::{debug, warn};

use super::{Shared, Status};
use crate::daemon::status_request::{reply, MAX_REQUEST, REFUSED};

/// Creates the socket (replacing a stale one, never a live one, and nothing that is not a
/// socket), readable and writable by the owner only.
pub fn bind(path: &Path) -> anyhow::Result<UnixListener> {
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
        UnixListener::bind(path).with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("restricting {}", path.display()))?;
    Ok(listener)
}

/// Answers requests until the task is dropped: one line each, as `status_request::reply`
/// decides.
pub async fn serve(listener: UnixListener, shared: Shared) {
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
