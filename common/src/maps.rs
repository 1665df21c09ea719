//! Map names, program names and the map value types of the kernel/userspace ABI.

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

/// Per-CPU array of [`IfaceStats`], [`MAX_IFACES`] slots: the slot of a watched interface is
/// the one its [`IfaceConfig`] names, assigned (and zeroed) by the controller before attaching.
/// An array rather than a hash keyed by ifindex: the verifier inlines its lookup.
pub const MAP_IFACE_STATS: &str = "LP_IFACE_STATS";
/// Hash: ifindex (`u32`) -> [`IfaceConfig`]. Only watched interfaces have an entry.
pub const MAP_IFACE_CONFIG: &str = "LP_IFACE_CONFIG";
/// Array of [`IfaceConfig`], [`IFACE_INDEX_SLOTS`] slots: the configuration of a watched
/// interface at `ifindex % IFACE_INDEX_SLOTS` (its `ifindex` field says whose it is), in front
/// of [`MAP_IFACE_CONFIG`], whose hash lookup costs a packet more than all its counters. Two
/// watched interfaces at the same slot: the second is found in the hash.
pub const MAP_IFACE_INDEX: &str = "LP_IFACE_INDEX";
/// Slots of [`MAP_IFACE_INDEX`] (a power of two).
pub const IFACE_INDEX_SLOTS: u32 = 256;
/// Hash: [`LocalAddr`] -> ifindex (`u32`): addresses of watched interfaces, used to attribute a
/// retransmission (whose tracepoint carries no device) to the interface owning its source address.
pub const MAP_LOCAL_ADDRS: &str = "LP_LOCAL_ADDRS";
/// LPM trie: [`PeerPrefix`] -> peer id (`u32`, 1..=[`MAX_PEERS`]); IPv4 prefixes as IPv4-mapped
/// IPv6 (`::ffff:0:0/96` + the IPv4 prefix).
pub const MAP_PEERS: &str = "LP_PEERS";
/// Per-CPU array of [`PeerCacheEntry`], [`PEER_CACHE_SLOTS`] slots: recent address -> peer
/// answers in front of the LPM trie, which costs 50-70 ns a lookup.
pub const MAP_PEER_CACHE: &str = "LP_PEER_CACHE";
/// Slots of [`MAP_PEER_CACHE`] per CPU (a power of two).
pub const PEER_CACHE_SLOTS: u32 = 256;

/// The cache slot of an address given as two native-endian words: all 128 bits folded to 32,
/// then a multiplicative hash's top bits, so that every address byte reaches the slot.
#[inline(always)]
pub fn peer_cache_slot(w: [u64; 2]) -> u32 {
    let x = w[0] ^ w[1];
    let folded = (x ^ (x >> 32)) as u32;
    folded.wrapping_mul(0x9E37_79B1) >> (32 - PEER_CACHE_SLOTS.trailing_zeros())
}
/// Array of one `u32`: the generation of [`MAP_PEERS`]. The controller increments it after every
/// change of the trie; cache entries of another generation are misses. Zero disables the cache.
pub const MAP_PEER_GENERATION: &str = "LP_PEER_GEN";

/// One slot of [`MAP_PEER_CACHE`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCacheEntry {
    /// The address (IPv4-mapped for IPv4) as two native-endian words.
    pub addr: [u64; 2],
    pub peer: u32,
    pub generation: u32,
}

/// Per-CPU array of [`PeerStats`], [`MAX_PEER_ENTRIES`] slots: the counters of (interface slot,
/// peer id) at [`peer_stats_index`].
pub const MAP_PEER_STATS: &str = "LP_PEER_STATS";

/// The index in [`MAP_PEER_STATS`] of an interface's slot and a peer id (at most
/// [`MAX_PEERS`]; [`PEER_OTHER`] included).
#[inline(always)]
pub fn peer_stats_index(slot: u32, peer: u32) -> u32 {
    slot * (MAX_PEERS + 1) + peer
}

/// Per-CPU array of one [`DatapathLosses`]: what the programs lost, by kind.
pub const MAP_LOSSES: &str = "LP_LOSSES";
/// Array of `u64`, one per [`crate::packet::Loss`] kind: `bpf_ktime_get_ns` of the last
/// warning the programs logged about that kind (at most one per [`LOSS_WARN_INTERVAL_NS`]).
pub const MAP_LOSS_WARNED: &str = "LP_LOSS_WARNED";
/// The programs warn about a kind of loss at most this often.
pub const LOSS_WARN_INTERVAL_NS: u64 = 10_000_000_000;

/// What the programs could not count, per CPU. Evictions from the flow table are not seen by
/// the programs: the controller derives them as inserts - removes - entries present.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathLosses {
    /// By [`crate::packet::Loss`] kind.
    pub by_kind: [u64; crate::packet::LOSS_KINDS],
    /// Flow-table inserts of a key that was absent, and removes of one that was present.
    pub flow_inserts: u64,
    pub flow_removes: u64,
}

impl DatapathLosses {
    pub fn accumulate(&mut self, o: &Self) {
        for (a, b) in self.by_kind.iter_mut().zip(o.by_kind) {
            *a = a.wrapping_add(b);
        }
        self.flow_inserts = self.flow_inserts.wrapping_add(o.flow_inserts);
        self.flow_removes = self.flow_removes.wrapping_add(o.flow_removes);
    }
}
/// Array of [`DscpRule`], [`MAX_DSCP_RULES`] slots; the egress program applies the first enabled
/// rule that matches.
pub const MAP_DSCP_RULES: &str = "LP_DSCP_RULES";
/// Slots of [`MAP_DSCP_RULES`]: a rule per watched interface (a link without peers on each of
/// [`MAX_IFACES`]), or e.g. 8 links x 2 interfaces x 4 peers. The scan stops at the first empty
/// slot, so a packet pays for the rules in use, not for the slots.
pub const MAX_DSCP_RULES: u32 = 64;
/// [`DscpRule::peer`] value matching every peer.
pub const ANY_PEER: u32 = u32::MAX;
/// Global of type [`KernelOffsets`], set at load time from the running kernel's BTF.
pub const GLOBAL_KERNEL_OFFSETS: &str = "LP_KERNEL_OFFSETS";

/// Capacity of the per-interface maps.
pub const MAX_IFACES: u32 = 64;
/// Capacity of [`MAP_LOCAL_ADDRS`].
pub const MAX_LOCAL_ADDRS: u32 = 1024;

/// Peers a policy can name.
pub const MAX_PEERS: u32 = 64;
/// Capacity of [`MAP_PEERS`]: prefixes (CIDRs) of all peers together.
pub const MAX_PEER_PREFIXES: u32 = MAX_PEERS * 4;
/// Peer id of traffic that matches no configured peer.
pub const PEER_OTHER: u32 = 0;
/// Capacity of [`MAP_PEER_STATS`]: every interface with every peer and "other".
pub const MAX_PEER_ENTRIES: u32 = MAX_IFACES * (MAX_PEERS + 1);

/// Address family numbers as the kernel uses them in tracepoints.
pub const AF_INET: u16 = 2;
/// IPv6 address family.
pub const AF_INET6: u16 = 10;

/// Per-interface counters, one copy per CPU; the controller sums them.
///
/// Packets are wire segments, not skbs: a GSO/GRO skb of `n` segments counts `n` packets and
/// `len + (n - 1) * header_len` bytes, the bytes the segments occupy on the wire including their
/// L2 header (without preamble, FCS and inter-frame gap).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceStats {
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// TCP segments retransmitted successfully from a source address of this interface
    /// (`tcp_skb_pcount` of each retransmitted skb, as the kernel's TcpRetransSegs counts).
    pub retrans_segs: u64,
    /// Retransmission attempts that the stack reported as failed (tracepoint `err != 0`).
    pub retrans_failed: u64,
    /// Egress packets whose DSCP a rule rewrote.
    pub tx_dscp_rewritten: u64,
    /// Packets that are not IPv4/IPv6 (ARP, LLDP, ...) or whose IP header is malformed or
    /// truncated, by direction: counted, never parsed further.
    pub rx_unknown: u64,
    pub tx_unknown: u64,
}

impl IfaceStats {
    /// Adds another CPU's counters to these.
    pub fn accumulate(&mut self, other: &Self) {
        self.rx_packets = self.rx_packets.wrapping_add(other.rx_packets);
        self.rx_bytes = self.rx_bytes.wrapping_add(other.rx_bytes);
        self.tx_packets = self.tx_packets.wrapping_add(other.tx_packets);
        self.tx_bytes = self.tx_bytes.wrapping_add(other.tx_bytes);
        self.retrans_segs = self.retrans_segs.wrapping_add(other.retrans_segs);
        self.retrans_failed = self.retrans_failed.wrapping_add(other.retrans_failed);
        self.rx_unknown = self.rx_unknown.wrapping_add(other.rx_unknown);
        self.tx_unknown = self.tx_unknown.wrapping_add(other.tx_unknown);
        self.tx_dscp_rewritten = self.tx_dscp_rewritten.wrapping_add(other.tx_dscp_rewritten);
    }
}

/// An egress DSCP rewrite: packets leaving interface `ifindex` to `peer` (or [`ANY_PEER`]) whose
/// source or destination port is in `port_lo..=port_hi` (0..=65535 for all; ports are ignored
/// for protocols without them only when the range is the full one) leave with DSCP `dscp`; the
/// ECN bits are kept. Every rule names its interface: links on different interfaces may reach
/// the same peer with different classes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DscpRule {
    /// Non-zero when the slot is in use.
    pub enabled: u32,
    pub ifindex: u32,
    pub peer: u32,
    pub port_lo: u16,
    pub port_hi: u16,
    /// 0..=63.
    pub dscp: u8,
    pub _pad: [u8; 3],
}

impl DscpRule {
    /// Whether the rule applies to a packet leaving `ifindex` to `peer` with ports
    /// `sport`/`dport`.
    #[inline(always)]
    pub fn matches(&self, ifindex: u32, peer: u32, sport: u16, dport: u16) -> bool {
        let all_ports = self.port_lo == 0 && self.port_hi == u16::MAX;
        let in_range = |p: u16| p >= self.port_lo && p <= self.port_hi;
        self.enabled != 0
            && self.ifindex == ifindex
            && (self.peer == ANY_PEER || self.peer == peer)
            && (all_ports || in_range(sport) || in_range(dport))
    }
}

/// Key of [`MAP_PEERS`] (the layout `bpf_lpm_trie_key` requires: prefix length, then data).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerPrefix {
    pub prefix_len: u32,
    pub addr: [u8; 16],
}

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
        self.packets = self.packets.wrapping_add(o.packets);
        self.bytes = self.bytes.wrapping_add(o.bytes);
        for i in 0..4 {
            self.ecn[i] = self.ecn[i].wrapping_add(o.ecn[i]);
        }
        self.tcp_ece = self.tcp_ece.wrapping_add(o.tcp_ece);
        self.tcp_cwr = self.tcp_cwr.wrapping_add(o.tcp_cwr);
        self.unparsed = self.unparsed.wrapping_add(o.unparsed);
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
        self.packets = self.packets.wrapping_add(o.packets);
        for i in 0..8 {
            self.by_class[i] = self.by_class[i].wrapping_add(o.by_class[i]);
        }
        self.cnp = self.cnp.wrapping_add(o.cnp);
        self.ack = self.ack.wrapping_add(o.ack);
        self.nak_rnr = self.nak_rnr.wrapping_add(o.nak_rnr);
        self.nak_psn_seq = self.nak_psn_seq.wrapping_add(o.nak_psn_seq);
        self.nak_other = self.nak_other.wrapping_add(o.nak_other);
        self.retransmitted = self.retransmitted.wrapping_add(o.retransmitted);
        self.truncated = self.truncated.wrapping_add(o.truncated);
    }
}

/// Key of [`MAP_ROCE_QPS`]: one direction of one destination QP of one peer address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpKey {
    pub ifindex: u32,
    /// 0 ingress, 1 egress.
    pub direction: u32,
    pub dest_qp: u32,
    pub remote: [u8; 16],
}

/// LRU hash: [`QpKey`] -> last PSN seen (`u32`), to spot repeated PSNs.
pub const MAP_ROCE_QPS: &str = "LP_ROCE_QPS";
/// Queue pairs tracked for retransmissions; the least recently used are forgotten.
pub const MAX_ROCE_QPS: u32 = 65536;

/// Hash: network namespace inode number (`u32`) -> the ifindex (`u32`) of the watched interface
/// whose counters take the flows of that namespace: the namespaces of reporting jobs that run
/// in their own (a pod's), whose addresses no watched interface owns. Empty unless the
/// policy opts in.
pub const MAP_JOB_NETNS: &str = "LP_JOB_NETNS";
/// Array of one `u32`: how many entries [`MAP_JOB_NETNS`] has; while 0 the tracepoints skip
/// the namespace read a socket of no watched address would otherwise cost.
pub const MAP_JOB_NETNS_COUNT: &str = "LP_JOB_NETNS_N";
/// Capacity of [`MAP_JOB_NETNS`].
pub const MAX_JOB_NAMESPACES: u32 = 256;

/// LRU hash: [`FlowKey`] -> [`FlowState`], written by the TCP tracepoints.
pub const MAP_FLOWS: &str = "LP_FLOWS";
/// Flows tracked; the least recently updated are forgotten first.
pub const MAX_FLOWS: u32 = 131_072;

/// A TCP flow seen from this host: local and remote address and port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    pub local_port: u16,
    pub remote_port: u16,
    pub _pad: u16,
    /// IPv4 as IPv4-mapped IPv6.
    pub local: [u8; 16],
    pub remote: [u8; 16],
}

/// What the tracepoints know of a flow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// Latest smoothed RTT (`tp->srtt_us >> 3`), microseconds.
    pub srtt_us: u32,
    /// Smallest smoothed RTT seen, microseconds.
    pub min_srtt_us: u32,
    /// RTT samples taken (ACKs received while data was in flight).
    pub rtt_samples: u64,
    /// Retransmitted segments.
    pub retrans_segs: u64,
    /// `bpf_ktime_get_ns` of the last update.
    pub last_ns: u64,
    pub ifindex: u32,
    pub peer: u32,
    pub snd_cwnd: u32,
    /// `snd_nxt` at the last RTT sample: once `snd_una` reaches it, everything the flow had in
    /// flight was acknowledged, so its own queue at the bottleneck had drained.
    pub snd_nxt: u32,
    /// Segments received CE-marked, counted by the TC ingress program (only for flows in the
    /// table): with the jobs' sockets, which marks fall on a job's flows and which on others'.
    pub ce_segs: u64,
    /// Segments received with TCP ECE set (the peer echoing marks on what this host sent).
    pub ece_segs: u64,
    /// The RTT of the first segment a flow sent after its flight emptied (a job's burst after
    /// an idle gap), microseconds: it queued only behind others' traffic, not the flow's own.
    /// Derived from the first smoothed RTT that moved (`srtt += (m - srtt) / 8`, within 8 us).
    pub burst_rtt_us: u32,
    /// Non-zero while waiting for that sample: the smoothed RTT the burst started from.
    pub burst_from_us: u32,
    /// `bpf_ktime_get_ns` when `burst_rtt_us` was taken (0: never).
    pub burst_ns: u64,
    /// The socket's network namespace (inode number; 0: not read, on kernels without BTF): a
    /// flow in a reporting job's own namespace is that job's.
    pub netns: u32,
    pub _pad: u32,
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
        self.samples = self.samples.wrapping_add(o.samples);
        self.sum_us = self.sum_us.wrapping_add(o.sum_us);
        if o.min_us != 0 && (self.min_us == 0 || o.min_us < self.min_us) {
            self.min_us = o.min_us;
        }
        self.max_us = self.max_us.max(o.max_us);
    }
}

/// TCP connections of one (interface, peer), from `sock:inet_sock_set_state`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
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
        self.active_opens = self.active_opens.wrapping_add(o.active_opens);
        self.passive_opens = self.passive_opens.wrapping_add(o.passive_opens);
        self.closes = self.closes.wrapping_add(o.closes);
        self.failed_opens = self.failed_opens.wrapping_add(o.failed_opens);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_cache_slots_spread_hosts_of_one_prefix() {
        let words = |a: [u8; 16]| {
            let (lo, hi) = a.split_at(8);
            [u64::from_ne_bytes(lo.try_into().unwrap()), u64::from_ne_bytes(hi.try_into().unwrap())]
        };
        let mut used = [false; PEER_CACHE_SLOTS as usize];
        for host in 0..=255u8 {
            // ::ffff:10.0.0.host, then 2001:db8:2::host.
            let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, host];
            let mut v6 = [0u8; 16];
            v6[..4].copy_from_slice(&[0x20, 0x01, 0x0d, 0xb8]);
            v6[5] = 2;
            v6[15] = host;
            for a in [v4, v6] {
                let slot = peer_cache_slot(words(a));
                assert!(slot < PEER_CACHE_SLOTS);
                used[slot as usize] = true;
            }
        }
        // 512 addresses over 256 slots: a good hash leaves ~1/e^2 of them empty.
        let n = used.iter().filter(|u| **u).count();
        assert!(n > 180, "{n} of 256 slots used");
    }

    #[test]
    fn dscp_rule_selectors() {
        let r = DscpRule {
            enabled: 1,
            ifindex: 7,
            peer: 2,
            port_lo: 0,
            port_hi: u16::MAX,
            dscp: 46,
            _pad: [0; 3],
        };
        assert!(r.matches(7, 2, 0, 0));
        assert!(!r.matches(7, 3, 0, 0));
        assert!(!r.matches(8, 2, 0, 0), "another interface");
        let r = DscpRule { peer: ANY_PEER, port_lo: 5201, port_hi: 5210, ..r };
        assert!(r.matches(7, 9, 40000, 5205) && r.matches(7, 9, 5201, 40000));
        assert!(!r.matches(7, 9, 40000, 5211));
        assert!(!r.matches(8, 9, 40000, 5205), "any peer, but only on its interface");
        assert!(!DscpRule { enabled: 0, ..r }.matches(7, 9, 5201, 5201));
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
        for i in 0..64 {
            self.tx_dscp[i] = self.tx_dscp[i].wrapping_add(o.tx_dscp[i]);
        }
    }
}

/// Link-layer framing of an interface, as TC programs see `skb->data`.
pub const L2_ETHERNET: u32 = 1;
/// No link-layer header: `skb->data` starts at the IP header (tun, wireguard, ...).
pub const L2_RAW_IP: u32 = 2;

/// What the TC programs need to know about a watched interface.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceConfig {
    /// The interface's index (0: an empty slot of [`MAP_IFACE_INDEX`]).
    pub ifindex: u32,
    /// [`L2_ETHERNET`] or [`L2_RAW_IP`].
    pub l2: u32,
    /// The interface's slot in [`MAP_IFACE_STATS`] and [`MAP_PEER_STATS`] (below [`MAX_IFACES`]).
    pub slot: u32,
    pub _pad: u32,
}

/// Key of [`MAP_LOCAL_ADDRS`]: an IPv4 address occupies the first 4 bytes, the rest are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LocalAddr {
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    pub _pad: u16,
    pub addr: [u8; 16],
}

/// Byte offsets inside kernel structures that the tracepoint programs read, and the network
/// namespace they count for. Zero in `tcp_gso_segs` means "unknown": each retransmitted skb then
/// counts as one segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// Offset of `tcp_skb_cb.tcp_gso_segs` (a `u16`) from the start of `struct sk_buff`, i.e.
    /// `offsetof(sk_buff, cb) + offsetof(tcp_skb_cb, tcp_gso_segs)`.
    pub skb_tcp_gso_segs: u32,
    /// Non-zero when the tracepoint record has the `err` field (Linux 6.13 and later); older
    /// kernels fire the tracepoint only for successful retransmissions.
    pub retransmit_has_err: u32,
    /// `offsetof(struct sock, __sk_common.skc_net)`: the socket's `struct net *`.
    pub sock_net: u32,
    /// `offsetof(struct net, ns.inum)`: the namespace's inode number, as `stat` shows it for
    /// `/proc/PID/ns/net`.
    pub net_inum: u32,
    /// The inode number of the network namespace whose interfaces are watched. Tracepoints are
    /// system-wide and addresses repeat across namespaces (containers, the lab), so a socket
    /// counts only when it lives in this namespace. Zero (or a zero offset): every namespace.
    pub netns_inum: u32,
    /// Non-zero when the `sock_*` offsets below were found in the kernel's BTF: retransmissions
    /// are then read from the socket by [`PROG_TCP_RETRANSMIT`]. (A zero offset is a real one:
    /// `skc_daddr` opens `struct sock`.)
    pub sock_known: u32,
    /// `offsetof(struct sock, __sk_common.skc_family)`, a `u16`.
    pub sock_family: u32,
    /// `__sk_common.skc_num`: the local port, host order (`u16`).
    pub sock_num: u32,
    /// `__sk_common.skc_dport`: the remote port, network order (`u16`).
    pub sock_dport: u32,
    /// `__sk_common.skc_rcv_saddr`: the local IPv4 address.
    pub sock_rcv_saddr: u32,
    /// `__sk_common.skc_daddr`: the remote IPv4 address.
    pub sock_daddr: u32,
    /// `__sk_common.skc_v6_rcv_saddr`: the local IPv6 address.
    pub sock_v6_rcv_saddr: u32,
    /// `__sk_common.skc_v6_daddr`: the remote IPv6 address.
    pub sock_v6_daddr: u32,
}

/// An IPv4 address as IPv4-mapped IPv6, the form peers and flows are keyed by.
#[inline(always)]
pub fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3]]
}

const _: () = assert!(core::mem::size_of::<IfaceStats>() == 72);
const _: () = assert!(core::mem::size_of::<DscpRule>() == 20);
const _: () = assert!(core::mem::size_of::<PeerPrefix>() == 20);
const _: () = assert!(core::mem::size_of::<DirCounters>() == 72);
const _: () = assert!(core::mem::size_of::<RoceCounters>() == 16 * 8);
const _: () = assert!(core::mem::size_of::<QpKey>() == 28);
const _: () = assert!(core::mem::size_of::<PeerStats>() == 2 * 72 + 2 * 128 + 32 + 8 + 32 + 64 * 8);
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);
const _: () = assert!(core::mem::size_of::<FlowState>() == 88);
const _: () = assert!(core::mem::size_of::<IfaceConfig>() == 16);
const _: () = assert!(core::mem::size_of::<LocalAddr>() == 20);
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 52);
const _: () = assert!(core::mem::size_of::<PeerCacheEntry>() == 24);
const _: () = assert!(core::mem::size_of::<DatapathLosses>() == 6 * 8);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are #[repr(C)], Copy, made only of integers, with no implicit padding (the size
    // assertions above pin their layouts), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::IfaceStats {}
    unsafe impl aya::Pod for super::IfaceConfig {}
    unsafe impl aya::Pod for super::LocalAddr {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::DscpRule {}
    unsafe impl aya::Pod for super::QpKey {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowState {}
    unsafe impl aya::Pod for super::PeerPrefix {}
    unsafe impl aya::Pod for super::PeerStats {}
    unsafe impl aya::Pod for super::DatapathLosses {}
}
