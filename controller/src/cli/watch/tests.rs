use super::*;

#[test]
fn dscp_selectors() {
    let d = parse_dscp("us=26").unwrap();
    assert_eq!((d.iface, d.peer.as_deref(), d.ports, d.dscp), (None, Some("us"), (0, 65535), 26));
    let d = parse_dscp("*:5201-5210=46").unwrap();
    assert_eq!((d.peer, d.ports, d.dscp), (None, (5201, 5210), 46));
    let d = parse_dscp("eth1/us:5201=10").unwrap();
    assert_eq!(
        (d.iface.as_deref(), d.peer.as_deref(), d.ports),
        (Some("eth1"), Some("us"), (5201, 5201))
    );
    for bad in ["us", "us=64", "us=x", "=3", "us:9-1=3", "us:70000=3", "/us=3", "eth1/=3"] {
        assert!(parse_dscp(bad).is_err(), "{bad}");
    }
}

#[test]
fn dscp_rules_are_per_interface() {
    let ifaces: Vec<Iface> =
        [("eth0", 2), ("eth1", 3)].map(|(n, i)| Iface { name: n.into(), ifindex: i, l2: 0 }).into();
    let peers = PeerIds::assign([("us", "198.18.2.0/24".parse().unwrap())]).unwrap();
    let args = [parse_dscp("eth1/us=10").unwrap(), parse_dscp("*=46").unwrap()];
    let rules = dscp_rules(&args, &ifaces, &peers).unwrap();
    let seen: Vec<_> = rules.iter().map(|r| (r.ifindex, r.peer, r.dscp)).collect();
    assert_eq!(seen, [(3, 1, 10), (2, ANY_PEER, 46), (3, ANY_PEER, 46)]);
    let err = |a: &str| dscp_rules(&[parse_dscp(a).unwrap()], &ifaces, &peers).unwrap_err();
    assert!(err("eth9/us=1").to_string().contains("interface \"eth9\", which no --iface"));
    assert!(err("eu=1").to_string().contains("peer \"eu\", which no --peer defines"));
    let many = vec![parse_dscp("*=1").unwrap(); 33];
    let e = dscp_rules(&many, &ifaces, &peers).unwrap_err().to_string();
    assert!(e.contains("--dscp makes 66 rules") && e.contains("at most 64 fit"), "{e}");
}

fn totals(rx: u64, retrans: u64) -> IfaceStats {
    IfaceStats { rx_packets: rx, rx_bytes: rx * 100, retrans_segs: retrans, ..Default::default() }
}

#[test]
fn rates_over_interval() {
    let r = rates(&totals(100, 1), &totals(300, 5), Duration::from_millis(500));
    assert_eq!(r.rx_packets_per_s, 400.0);
    assert_eq!(r.rx_bytes_per_s, 40_000.0);
    assert_eq!(r.retrans_segs_per_s, 8.0);
}

#[test]
fn reset_counts_from_zero_and_zero_interval_is_safe() {
    let r = rates(&totals(1_000, 0), &totals(10, 0), Duration::from_secs(1));
    assert_eq!(r.rx_packets_per_s, 10.0);
    assert_eq!(rates(&totals(1, 0), &totals(2, 0), Duration::ZERO), Rates::default());
}

#[test]
fn ce_share_of_ecn_capable() {
    let a = DirTotals { ect0: 100, ce: 10, ..Default::default() };
    let b = DirTotals { ect0: 190, ce: 20, not_ect: 500, ..Default::default() };
    assert_eq!(ce_fraction(&a, &b), 0.1);
    assert_eq!(ce_fraction(&a, &a), 0.0);
}

#[test]
fn dscp_histogram_keeps_non_zero() {
    let mut s = PeerStats::default();
    s.tx_dscp[46] = 7;
    let t = PeerTotals::new("us", &s);
    assert_eq!(t.tx_dscp, BTreeMap::from([(46, 7)]));
}

#[test]
fn human_units() {
    assert_eq!(human_bits(0.0), "0");
    assert_eq!(human_bits(999.0), "999");
    assert_eq!(human_bits(1_500.0), "1.50k");
    assert_eq!(human_bits(40e9), "40.00G");
}

#[test]
fn peers() {
    assert!(parse_peer("us=198.18.2.0/24").is_ok());
    assert_eq!(parse_peer("h=198.18.2.1").unwrap().1.prefix_len(), 32);
    assert!(parse_peer("other=10.0.0.0/8").is_err());
    assert!(parse_peer("a/b=10.0.0.0/8").is_err(), "'/' separates --dscp's interface");
    assert!(parse_peer("x=nonsense").is_err());
}
