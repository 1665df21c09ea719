//! A trace of snapshots (JSON lines, as `watch --snapshots` prints and the daemon records), as
//! `linkpilot replay` reads it, then run through a fresh core under the shipped hk-us policy.

use linkpilot::control::{policy::SHIPPED, replay, Policy};

pub fn check(data: &[u8]) {
    let Ok(trace) = replay::read_trace(data, "fuzz.jsonl") else { return };
    let src = SHIPPED.iter().find(|(n, _)| *n == "hk-us").map(|(_, s)| *s).unwrap_or_default();
    let mut policy = Policy::parse(src, "hk-us.toml").expect("the shipped policy");
    // As `replay` does for a trace of one interface: the policy follows it.
    if let Some(link) = trace.iter().flat_map(|s| &s.peers).map(|p| p.link.clone()).next() {
        policy.rename_interface("@default-route", &link);
    }
    let r = replay::run(&policy, &trace);
    for d in &r.decisions {
        let _ = replay::timeline_line(d);
        serde_json::to_string(d).expect("a decision serialises");
    }
}
