//! The DaemonSets against the systemd unit (deploy/linkpilot.service): the same capabilities
//! and nothing more, at least its stop timeout, and the host's /run/linkpilot as its
//! RuntimeDirectory. Both ways of running the daemon must grant it the same.

use std::collections::BTreeSet;

use crate::manifests::*;

/// `KEY=VALUE` of the unit's [Service] section.
fn unit(key: &str) -> String {
    let text = std::fs::read_to_string(repo("deploy/linkpilot.service")).expect("unit");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in deploy/linkpilot.service"))
        .trim()
        .to_owned()
}

#[test]
fn every_daemonset_has_the_units_capabilities_and_nothing_more() {
    let all = resources();
    let unit_caps: BTreeSet<String> = unit("CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.strip_prefix("CAP_").expect("CAP_ name").to_owned())
        .collect();
    let stop: u64 = unit("TimeoutStopSec").trim_end_matches('s').parse().expect("seconds");
    for ds in daemonsets(&all) {
        let pod = pod_spec(ds);
        let sc = &container(pod, "linkpilot")["securityContext"];
        let added: BTreeSet<String> = strings(&sc["capabilities"]["add"]).into_iter().collect();
        assert_eq!(added, unit_caps, "{}: its capabilities against the unit's", name(ds));
        assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{}", name(ds));
        assert_eq!(
            (&sc["privileged"], &sc["allowPrivilegeEscalation"]),
            (&false.into(), &false.into()),
            "{}",
            name(ds)
        );
        // Every init container (the policy check, the tuner's install) is unprivileged.
        for c in pod["initContainers"].as_array().into_iter().flatten() {
            let sc = &c["securityContext"];
            assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"], "{}", c["name"]);
            assert!(sc["capabilities"]["add"].is_null(), "{}", c["name"]);
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{}", c["name"]);
        }
        // The SIGTERM rollback gets at least the unit's stop timeout.
        let grace = pod["terminationGracePeriodSeconds"].as_u64();
        assert!(grace.is_some_and(|g| g >= stop), "{}: grace {grace:?} < {stop}", name(ds));
        assert_eq!(pod["hostNetwork"], true, "{}", name(ds));
    }
}

#[test]
fn run_directory_is_the_hosts_run_linkpilot() {
    let all = resources();
    assert_eq!(unit("RuntimeDirectory"), "linkpilot", "the unit's /run/linkpilot");
    for ds in daemonsets(&all) {
        let pod = pod_spec(ds);
        let (volume, _) = mounted_at(pod, container(pod, "linkpilot"), "/run/linkpilot");
        assert_eq!(volume["hostPath"]["path"], "/run/linkpilot", "{}: {volume}", name(ds));
    }
}
