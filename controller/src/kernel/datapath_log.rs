//! The programs' warnings about what they lose (aya-log records in a ring buffer), forwarded to
//! this process's tracing output as they arrive (the `log` records they become reach tracing
//! through the subscriber's log bridge).

use aya_log::EbpfLogger;
use tokio::io::{unix::AsyncFd, Interest};

use super::probes::Probes;

/// Forwards the warnings of `probes`' programs (see [`forward`]); `None` if they are forwarded
/// already.
pub fn forward_from(probes: &mut Probes) -> std::io::Result<Option<tokio::task::JoinHandle<()>>> {
    probes.take_logger().map(forward).transpose()
}

/// Forwards every record `logger` receives until the task is dropped or the ring buffer fails.
/// Needs a tokio runtime.
pub fn forward(
    logger: EbpfLogger<&'static dyn log::Log>,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    // SAFETY: the logger owns its ring buffer's fd, open and unchanged until it is dropped,
    // which only the AsyncFd can do.
    let mut fd = unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) }
        .map_err(std::io::Error::from)?;
    Ok(tokio::spawn(async move {
        loop {
            let Ok(mut ready) = fd.readable_mut().await else { return };
            ready.get_inner_mut().flush();
            ready.clear_ready();
        }
    }))
}
