//! The header parser the TC programs run (common/src/packet/), over packet bytes as TC sees
//! them: the first byte picks the link type (Ethernet, raw IP, or an unknown one). The fast path
//! (common/src/fixed.rs) must agree with it wherever it answers.

use linkpilot_common::{
    fixed::parse_fixed,
    packet::{
        parse, parse_bth, segment_header_len, unparsed_loss, wire_bytes, Headers, ROCEV2_PORT,
    },
    L2_ETHERNET, L2_RAW_IP,
};

pub fn check(data: &[u8]) {
    let Some((&kind, p)) = data.split_first() else { return };
    let l2 = match kind % 3 {
        0 => L2_ETHERNET,
        1 => L2_RAW_IP,
        _ => u32::from(kind),
    };
    let h = parse(p, l2);
    // The programs' fast path, where it answers, agrees with the parser.
    let mut fast = Headers::default();
    if parse_fixed(p, l2, &mut fast) {
        assert_eq!(Some(fast), h, "the fast path disagrees");
    }
    if h.is_none() {
        let _ = unparsed_loss(p, l2);
    }
    let seg = segment_header_len(p, l2);
    assert_eq!(seg, h.and_then(|h| (h.header_len != 0).then_some(usize::from(h.header_len))));
    let Some(h) = h else {
        assert!(seg.is_none());
        return;
    };
    assert!(l2 == L2_ETHERNET || l2 == L2_RAW_IP, "parsed an unknown link type");
    assert!(usize::from(h.l3) < p.len(), "IP header at {} of {}", h.l3, p.len());
    if h.l4 != 0 {
        assert!(h.l4 > h.l3 && usize::from(h.l4) <= p.len(), "{h:?} of {} bytes", p.len());
    }
    if h.header_len != 0 {
        assert!(h.l4 != 0 && h.header_len > h.l4, "{h:?}");
        assert!(usize::from(h.header_len) <= p.len(), "{h:?} of {} bytes", p.len());
    }
    let _ = wire_bytes(p.len() as u32, u32::from(kind), seg);
    if h.proto == 17 && h.dport == ROCEV2_PORT && h.header_len != 0 {
        if let Some(bth) = parse_bth(p, usize::from(h.header_len)) {
            let _ = (bth.class(), bth.is_ack());
            assert!(bth.dest_qp < 1 << 24 && bth.psn < 1 << 24);
        }
    }
    // The BTH parser alone, anywhere in the packet.
    let _ = parse_bth(p, usize::from(kind));
}
