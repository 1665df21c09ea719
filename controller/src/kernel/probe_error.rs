//! What can go wrong loading, attaching and using the eBPF programs, with the verifier's reason
//! kept short for the error and whole at debug level.

use aya::{maps::MapError, programs::ProgramError, EbpfError};
use linkpilot_common::{MAX_DSCP_RULES, MAX_IFACES, MAX_PEERS};
use tracing::debug;

/// Failure to load, attach or use the eBPF programs.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("this linkpilot was built without its eBPF programs (the `native` feature)")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Object(#[source] Box<EbpfError>),
    #[error("the eBPF object has no {kind} named {name}")]
    Missing { kind: &'static str, name: &'static str },
    #[error("the kernel verifier rejected program {program}: {summary} (full log at debug level)")]
    Verifier { program: &'static str, summary: String },
    #[error("{action} program {program}: {source}")]
    Program { action: &'static str, program: &'static str, source: Box<ProgramError> },
    #[error("attaching {program} to {iface} ({direction}): {source}")]
    Attach {
        program: &'static str,
        iface: String,
        direction: &'static str,
        source: Box<ProgramError>,
    },
    #[error("{count} DSCP rules given; at most {MAX_DSCP_RULES} fit")]
    TooManyRules { count: usize },
    #[error("peer id {id} is out of range: ids are 1 to {MAX_PEERS}")]
    PeerId { id: u32 },
    #[error("map {map}: {source}")]
    Map { map: &'static str, source: Box<MapError> },
    #[error("opening the programs' log (aya-log): {0}")]
    Log(#[source] Box<aya_log::Error>),
    #[error(
        "cannot count on interface {ifindex}: all {slots} counter slots are in use (at most \
         {MAX_IFACES} interfaces)"
    )]
    TooManyIfaces { ifindex: u32, slots: u32 },
    #[error(
        "interface {ifindex} is configured with counter slot {slot}, past the last of {slots}"
    )]
    Slot { ifindex: u32, slot: u32, slots: u32 },
}

pub(super) fn map_error(map: &'static str, e: MapError) -> ProbeError {
    ProbeError::Map { map, source: Box::new(e) }
}

/// Logs the whole verifier log at debug level and keeps its last meaningful lines for the error.
pub(super) fn load_error(program: &'static str, error: ProgramError) -> ProbeError {
    match error {
        ProgramError::LoadError { io_error, verifier_log } => {
            let log = verifier_log.to_string();
            debug!(program, %log, "verifier log");
            ProbeError::Verifier { program, summary: verifier_summary(&io_error, &log) }
        }
        e => ProbeError::Program { action: "loading", program, source: Box::new(e) },
    }
}

/// The kernel's errno plus the last non-statistics lines of the verifier log, where the verifier
/// states why it gave up.
fn verifier_summary(io_error: &std::io::Error, log: &str) -> String {
    let tail: Vec<&str> = log
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("processed ") && !l.starts_with("verification time")
        })
        .rev()
        .take(3)
        .collect();
    if tail.is_empty() {
        io_error.to_string()
    } else {
        format!("{io_error}: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verifier_summary_keeps_the_reason() {
        let log = "0: (b7) r0 = 0\n1: (79) r1 = *(u64 *)(r1 +8)\ninvalid bpf_context access off=8 size=8\n\
                   processed 2 insns (limit 1000000) max_states_per_insn 0\n";
        let io = std::io::Error::from_raw_os_error(libc::EACCES);
        let s = verifier_summary(&io, log);
        assert!(s.starts_with("Permission denied"), "{s}");
        assert!(s.ends_with("invalid bpf_context access off=8 size=8"), "{s}");
        assert!(!s.contains("processed"), "{s}");
        assert_eq!(verifier_summary(&io, ""), io.to_string());
    }
}
