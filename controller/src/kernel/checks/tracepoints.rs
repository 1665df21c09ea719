//! Tracepoint record layouts: the programs read `tcp:tcp_retransmit_skb`, `tcp:tcp_probe` and
//! `sock:inet_sock_set_state` records at fixed offsets, so each layout is checked against the
//! kernel's tracefs `format` file before anything is loaded.

use std::fs;

use linkpilot_common::{probe_record, retransmit_record, sock_state_record};

use super::{tracefs, KernelError};

/// A tracepoint the programs read, and where they read each field of its record.
struct Tracepoint {
    category: &'static str,
    event: &'static str,
    fields: &'static [(&'static str, usize)],
}

/// `(field, offset)` pairs of a record, each field read at the named constant of `$record`.
macro_rules! fields {
    ($record:ident: $($field:ident = $offset:ident),+ $(,)?) => {
        &[$((stringify!($field), $record::$offset)),+]
    };
}

/// What the retransmission program reads from the record (its fallback without BTF).
const RETRANSMIT: Tracepoint = Tracepoint {
    category: "tcp",
    event: "tcp_retransmit_skb",
    fields: fields!(retransmit_record:
        skbaddr = SKBADDR, skaddr = SKADDR, sport = SPORT, dport = DPORT, family = FAMILY,
        saddr = SADDR, daddr = DADDR, saddr_v6 = SADDR_V6, daddr_v6 = DADDR_V6),
};

/// What the RTT program reads.
const PROBE: Tracepoint = Tracepoint {
    category: "tcp",
    event: "tcp_probe",
    fields: fields!(probe_record:
        saddr = SADDR, daddr = DADDR, sport = SPORT, dport = DPORT, family = FAMILY,
        snd_nxt = SND_NXT, snd_una = SND_UNA, snd_cwnd = SND_CWND, srtt = SRTT, skaddr = SKADDR),
};

/// What the flow program reads.
const SOCK_STATE: Tracepoint = Tracepoint {
    category: "sock",
    event: "inet_sock_set_state",
    fields: fields!(sock_state_record:
        skaddr = SKADDR, oldstate = OLDSTATE, newstate = NEWSTATE, sport = SPORT, dport = DPORT,
        family = FAMILY, protocol = PROTOCOL, saddr = SADDR, daddr = DADDR, saddr_v6 = SADDR_V6,
        daddr_v6 = DADDR_V6),
};

impl Tracepoint {
    fn name(&self) -> String {
        format!("{}:{}", self.category, self.event)
    }

    /// Its tracefs `format` file.
    fn format(&self) -> Result<String, KernelError> {
        let path = tracefs()?.join(format!("events/{}/{}/format", self.category, self.event));
        fs::read_to_string(&path).map_err(|_| KernelError::NoTracepoint {
            name: self.name(),
            path: path.display().to_string(),
        })
    }

    /// Checks that every field of `format` is where the program reads it.
    fn check(&self, format: &str) -> Result<(), KernelError> {
        let fields = format_offsets(format);
        for &(field, expected) in self.fields {
            let found = fields.iter().find(|(n, _)| n == field).map(|(_, o)| *o);
            if found != Some(expected) {
                return Err(KernelError::TracepointLayout {
                    tracepoint: self.name(),
                    field,
                    expected,
                    found,
                });
            }
        }
        Ok(())
    }
}

/// Field name -> offset, from a tracefs `format` file.
fn format_offsets(format: &str) -> Vec<(String, usize)> {
    // Lines look like: "\tfield:__u16 family;\toffset:32;\tsize:2;\tsigned:0;"
    format
        .lines()
        .filter_map(|line| {
            let decl = line.trim().strip_prefix("field:")?.split(';').next()?;
            let name = decl.rsplit([' ', '*']).next()?.split('[').next()?.to_owned();
            let off = line.split("offset:").nth(1)?.split(';').next()?.trim().parse().ok()?;
            Some((name, off))
        })
        .collect()
}

/// Checks that `tcp:tcp_retransmit_skb` exists and has the layout the program reads; returns
/// whether it carries the `err` field.
pub fn check_retransmit_tracepoint() -> Result<bool, KernelError> {
    check_retransmit_layout(&RETRANSMIT.format()?)
}

/// Checks that `tcp:tcp_probe` exists and has the layout the RTT program reads.
pub fn check_probe_tracepoint() -> Result<(), KernelError> {
    PROBE.check(&PROBE.format()?)
}

/// Checks that `sock:inet_sock_set_state` exists and has the layout the flow program reads.
pub fn check_sock_state_tracepoint() -> Result<(), KernelError> {
    SOCK_STATE.check(&SOCK_STATE.format()?)
}

fn check_retransmit_layout(format: &str) -> Result<bool, KernelError> {
    RETRANSMIT.check(format)?;
    let fields = format_offsets(format);
    let offset_of = |f: &str| fields.iter().find(|(n, _)| n == f).map(|(_, o)| *o);
    match offset_of("err") {
        None => Ok(false),
        Some(o) if o == retransmit_record::ERR => Ok(true),
        found => Err(KernelError::TracepointLayout {
            tracepoint: RETRANSMIT.name(),
            field: "err",
            expected: retransmit_record::ERR,
            found,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT_6_18: &str = "name: tcp_retransmit_skb\nID: 2281\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:__u16 family;\toffset:32;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr[4];\toffset:34;\tsize:4;\tsigned:0;\n\
\tfield:__u8 daddr[4];\toffset:38;\tsize:4;\tsigned:0;\n\
\tfield:__u16 sport;\toffset:28;\tsize:2;\tsigned:0;\n\
\tfield:__u16 dport;\toffset:30;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr_v6[16];\toffset:42;\tsize:16;\tsigned:0;\n\
\tfield:__u8 daddr_v6[16];\toffset:58;\tsize:16;\tsigned:0;\n\
\tfield:int err;\toffset:76;\tsize:4;\tsigned:1;\n";

    #[test]
    fn parses_tracefs_format() {
        let f = format_offsets(FORMAT_6_18);
        assert!(f.contains(&("skbaddr".to_owned(), 8)));
        assert!(f.contains(&("saddr_v6".to_owned(), 42)));
        assert!(check_retransmit_layout(FORMAT_6_18).unwrap());
        let without_err: String =
            FORMAT_6_18.lines().filter(|l| !l.contains(" err;")).collect::<Vec<_>>().join("\n");
        assert!(!check_retransmit_layout(&without_err).unwrap());
    }

    #[test]
    fn layout_mismatch_names_the_field() {
        let moved = FORMAT_6_18.replace("family;\toffset:32", "family;\toffset:36");
        let err = check_retransmit_layout(&moved).unwrap_err().to_string();
        assert!(err.contains("field family is at offset Some(36)"), "{err}");
    }
}
