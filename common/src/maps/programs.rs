//! Program names: the names the loader looks the programs up by and the kernel, bpftool and the
//! stale-attachment check list them by.

/// TC classifier on ingress. Program names are at most 15 bytes (`BPF_OBJ_NAME_LEN` - 1), so the
/// kernel, bpftool and our own stale-attachment check all see the same name.
pub const PROG_TC_INGRESS: &str = "lp_tc_ingress";
/// TC classifier on egress.
pub const PROG_TC_EGRESS: &str = "lp_tc_egress";
/// `tcp_retransmit_skb` as a raw tracepoint: the kernel skips a program on a CPU where it is
/// already running, not (as for a tracepoint) where any tracing program runs, so retransmissions
/// are not lost while `lp_tcp_probe` or another tool's program is interrupted on that CPU.
pub const PROG_TCP_RETRANSMIT: &str = "lp_tcp_retrans";
/// `tcp:tcp_retransmit_skb` as a tracepoint, reading its record: the fallback on a kernel without
/// BTF, whose socket layout the raw tracepoint program cannot know.
pub const PROG_TCP_RETRANSMIT_RECORD: &str = "lp_tcp_retr_tp";
/// `tcp:tcp_probe` tracepoint (RTT).
pub const PROG_TCP_PROBE: &str = "lp_tcp_probe";
/// `sock:inet_sock_set_state` tracepoint (TCP flows opening and closing).
pub const PROG_SOCK_STATE: &str = "lp_sock_state";
/// An empty classifier, loaded only by the benchmark as its baseline.
pub const PROG_TC_NOOP: &str = "lp_tc_noop";
/// The programs `watch` and `run` load on a kernel with BTF (the empty baseline aside), to
/// recognise them among the kernel's loaded programs; [`PROG_TCP_RETRANSMIT_RECORD`] takes
/// [`PROG_TCP_RETRANSMIT`]'s place on a kernel without.
pub const PROGRAM_NAMES: [&str; 6] = [
    PROG_TC_INGRESS,
    PROG_TC_EGRESS,
    PROG_TCP_RETRANSMIT,
    PROG_TCP_PROBE,
    PROG_SOCK_STATE,
    PROG_TC_NOOP,
];
