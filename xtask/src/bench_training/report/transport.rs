//! The transport a configuration's runs had, as the report states it: the first run's read-back
//! and whether every repeat had the same sysctls. Separate from `bench_training::transport`,
//! which applies and reads the settings; this only summarizes them over repeats.

use serde_json::{json, Value};

use super::Run;

/// The transport a configuration's runs had: the first run's read-back at the pass's end and
/// what the benchmark applied in the initial namespace, and whether every repeat had the same.
pub(super) fn transport_of(runs: &[&Run]) -> Value {
    let Some(first) = runs.first() else { return Value::Null };
    let settings = |r: &Run| r.transport["at_pass_end"].clone();
    // Connection counts can differ between repeats; the sysctls must not.
    let sysctls = |r: &Run| {
        let t = settings(r);
        let hosts: Vec<Value> = t["hosts"]
            .as_object()
            .map(|h| h.values().map(without_cc).collect())
            .unwrap_or_default();
        (t["initial_namespace"].clone(), hosts)
    };
    let same = runs.iter().all(|r| sysctls(r) == sysctls(first));
    json!({
        "read_back": settings(first),
        "applied_in_initial_namespace": first.applied,
        "same_in_every_repeat": same,
    })
}

fn without_cc(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("connections_cc");
    }
    v
}
