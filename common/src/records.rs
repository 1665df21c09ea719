//! Layouts of the tracepoint records the programs read (tracefs format files): field offsets the
//! controller checks against the running kernel before loading, and the TCP states
//! `sock:inet_sock_set_state` reports.

/// Offsets in the `tcp:tcp_retransmit_skb` record that the program reads. The controller checks
/// them against the running kernel's tracefs format file before loading.
pub mod retransmit_record {
    pub const SKBADDR: usize = 8;
    pub const SKADDR: usize = 16;
    pub const SPORT: usize = 28;
    pub const DPORT: usize = 30;
    pub const FAMILY: usize = 32;
    pub const SADDR: usize = 34;
    pub const DADDR: usize = 38;
    pub const SADDR_V6: usize = 42;
    pub const DADDR_V6: usize = 58;
    pub const ERR: usize = 76;
}

/// Offsets in the `tcp:tcp_probe` record that the program reads (checked against tracefs).
pub mod probe_record {
    /// `struct sockaddr_in` / `sockaddr_in6` of the local end, 28 bytes.
    pub const SADDR: usize = 8;
    pub const DADDR: usize = 36;
    pub const SPORT: usize = 64;
    pub const DPORT: usize = 66;
    pub const FAMILY: usize = 68;
    pub const SND_NXT: usize = 80;
    pub const SND_UNA: usize = 84;
    pub const SND_CWND: usize = 88;
    pub const SRTT: usize = 100;
    pub const SKADDR: usize = 128;
}

/// Offsets in the `sock:inet_sock_set_state` record that the program reads (checked against
/// tracefs).
pub mod sock_state_record {
    pub const SKADDR: usize = 8;
    pub const OLDSTATE: usize = 16;
    pub const NEWSTATE: usize = 20;
    pub const SPORT: usize = 24;
    pub const DPORT: usize = 26;
    pub const FAMILY: usize = 28;
    pub const PROTOCOL: usize = 30;
    pub const SADDR: usize = 32;
    pub const DADDR: usize = 36;
    pub const SADDR_V6: usize = 40;
    pub const DADDR_V6: usize = 56;
}

/// TCP states as `include/net/tcp_states.h` numbers them.
pub mod tcp_state {
    pub const ESTABLISHED: i32 = 1;
    pub const SYN_SENT: i32 = 2;
    pub const SYN_RECV: i32 = 3;
    pub const FIN_WAIT1: i32 = 4;
    pub const FIN_WAIT2: i32 = 5;
    pub const CLOSE: i32 = 7;
    pub const CLOSE_WAIT: i32 = 8;
    pub const LAST_ACK: i32 = 9;
    pub const CLOSING: i32 = 11;
}
