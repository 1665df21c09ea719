//! Per (interface, peer) counters: the value of the per-CPU peer statistics array, built of one
//! block per signal (traffic and ECN, RoCEv2, RTT, TCP connections), each summed over CPUs.

use super::{add_each, MAX_IFACES, MAX_PEERS};

/// Per-CPU array of [`PeerStats`], [`MAX_PEER_ENTRIES`] slots: the counters of (interface slot,
/// peer id) at [`peer_stats_index`].
pub const MAP_PEER_STATS: &str = "LP_PEER_STATS";

/// The index in [`MAP_PEER_STATS`] of an interface's slot and a peer id (at most
/// [`MAX_PEERS`]; [`PEER_OTHER`](super::PEER_OTHER) included).
#[inline(always)]
pub fn peer_stats_index(slot: u32, peer: u32) -> u32 {
    slot * (MAX_PEERS + 1) + peer
}

/// Capacity of [`MAP_PEER_STATS`]: every interface with every peer and "other".
pub const MAX_PEER_ENTRIES: u32 = MAX_IFACES * (MAX_PEERS + 1);

/// Counters of one direction of one (interface, peer), in segments.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirCounters {
    pub packets: u64,
    pub bytes: u64,
    /// By ECN codepoint: Not-ECT, ECT(1), ECT(0), CE.
    pub ecn: [u64; 4],
    /// TCP segments with ECE set (the receiver echoing congestion back).
    pub tcp_ece: u64,
    /// TCP segments with CWR set (the sender reacting).
    pub tcp_cwr: u64,
    /// IP packets whose transport header could not be reached (long IPv6 extension chains,
    /// non-first fragments, truncation): counted, never read past IP.
    pub unparsed: u64,
}

impl DirCounters {
    pub fn accumulate(&mut self, o: &Self) {
        add_wrapping!(self, o; packets, bytes, tcp_ece, tcp_cwr, unparsed);
        add_each(&mut self.ecn, &o.ecn);
    }
}

/// RoCEv2 (UDP 4791) counters of one direction, in packets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoceCounters {
    pub packets: u64,
    /// By BTH transport class (opcode >> 5): RC, UC, RD, UD, CNP, XRC, and two reserved classes.
    pub by_class: [u64; 8],
    /// Congestion Notification Packets (opcode 0x81).
    pub cnp: u64,
    /// AETH syndromes: ACK, RNR NAK, NAK "PSN sequence error", other NAKs.
    pub ack: u64,
    pub nak_rnr: u64,
    pub nak_psn_seq: u64,
    pub nak_other: u64,
    /// Packets whose PSN is not after the last one seen on their destination QP: resent.
    pub retransmitted: u64,
    /// UDP 4791 packets too short for a BTH.
    pub truncated: u64,
}

impl RoceCounters {
    pub fn accumulate(&mut self, o: &Self) {
        add_wrapping!(self, o;
            packets, cnp, ack, nak_rnr, nak_psn_seq, nak_other, retransmitted, truncated);
        add_each(&mut self.by_class, &o.by_class);
    }
}

/// RTT samples of one (interface, peer), from the flows' smoothed RTTs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RttCounters {
    pub samples: u64,
    pub sum_us: u64,
    /// Smallest sample (0: none yet).
    pub min_us: u64,
    pub max_us: u64,
}

impl RttCounters {
    pub fn accumulate(&mut self, o: &Self) {
        add_wrapping!(self, o; samples, sum_us);
        if o.min_us != 0 && (self.min_us == 0 || o.min_us < self.min_us) {
            self.min_us = o.min_us;
        }
        self.max_us = self.max_us.max(o.max_us);
    }
}

/// TCP connections of one (interface, peer), from `sock:inet_sock_set_state`; `linkpilot watch`
/// prints them as they are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "std", derive(serde::Serialize, serde::Deserialize))]
pub struct FlowEvents {
    /// SYN_SENT -> ESTABLISHED: connections this host opened (nstat TcpActiveOpens counts the
    /// attempts, these the successes).
    pub active_opens: u64,
    /// SYN_RECV -> ESTABLISHED: connections this host accepted (nstat TcpPassiveOpens).
    pub passive_opens: u64,
    /// Established connections that reached CLOSE (FIN or RST).
    pub closes: u64,
    /// SYN_SENT -> CLOSE: connection attempts that failed (refused, timed out).
    pub failed_opens: u64,
}

impl FlowEvents {
    pub fn accumulate(&mut self, o: &Self) {
        add_wrapping!(self, o; active_opens, passive_opens, closes, failed_opens);
    }
}

/// Per (interface, peer) counters, one copy per CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerStats {
    pub rx: DirCounters,
    pub tx: DirCounters,
    pub rx_roce: RoceCounters,
    pub tx_roce: RoceCounters,
    pub rtt: RttCounters,
    /// TCP segments retransmitted to this peer.
    pub retrans_segs: u64,
    pub flows: FlowEvents,
    /// Egress segments by DSCP (0..=63).
    pub tx_dscp: [u64; 64],
}

impl Default for PeerStats {
    fn default() -> Self {
        Self {
            rx: DirCounters::default(),
            tx: DirCounters::default(),
            rx_roce: RoceCounters::default(),
            tx_roce: RoceCounters::default(),
            rtt: RttCounters::default(),
            retrans_segs: 0,
            flows: FlowEvents::default(),
            tx_dscp: [0; 64],
        }
    }
}

impl PeerStats {
    pub fn accumulate(&mut self, o: &Self) {
        self.rx.accumulate(&o.rx);
        self.tx.accumulate(&o.tx);
        self.rx_roce.accumulate(&o.rx_roce);
        self.tx_roce.accumulate(&o.tx_roce);
        self.rtt.accumulate(&o.rtt);
        self.retrans_segs = self.retrans_segs.wrapping_add(o.retrans_segs);
        self.flows.accumulate(&o.flows);
        add_each(&mut self.tx_dscp, &o.tx_dscp);
    }
}
