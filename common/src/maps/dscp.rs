//! Egress DSCP rewrite rules: the rule table the egress program scans and the match it applies.

/// Array of [`DscpRule`], [`MAX_DSCP_RULES`] slots; the egress program applies the first enabled
/// rule that matches.
pub const MAP_DSCP_RULES: &str = "LP_DSCP_RULES";
/// Slots of [`MAP_DSCP_RULES`]: a rule per watched interface (a link without peers on each of
/// [`MAX_IFACES`](super::MAX_IFACES)), or e.g. 8 links x 2 interfaces x 4 peers. The scan stops
/// at the first empty slot, so a packet pays for the rules in use, not for the slots.
pub const MAX_DSCP_RULES: u32 = 64;
/// [`DscpRule::peer`] value matching every peer.
pub const ANY_PEER: u32 = u32::MAX;

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

#[cfg(test)]
mod tests {
    use super::*;

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
