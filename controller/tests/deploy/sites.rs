//! The DaemonSets per site: exactly one on every node (a DaemonSet per site label, one for the
//! nodes in no site), selectors that pick only their own pods, and site DaemonSets that are the
//! default one but for what a site changes.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::manifests::*;

#[test]
fn every_node_runs_exactly_one_daemonset() {
    let all = resources();
    let sets = daemonsets(&all);
    let sites: Vec<String> = sets.iter().filter_map(|ds| site(ds)).collect();
    let distinct: BTreeSet<&String> = sites.iter().collect();
    assert_eq!(distinct.len(), sites.len(), "two DaemonSets for one site: {sites:?}");
    assert!(sites.len() >= 2, "a DaemonSet per site: {sites:?}");
    // The one DaemonSet without a nodeSelector takes every node outside those sites (a node
    // without the label, or with a site that has no DaemonSet), through its affinity.
    let default: Vec<&&Value> = sets.iter().filter(|ds| site(ds).is_none()).collect();
    assert_eq!(default.len(), 1, "one DaemonSet for the nodes in no site");
    let terms = &pod_spec(default[0])["affinity"]["nodeAffinity"]
        ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"];
    assert_eq!(terms.as_array().map(Vec::len), Some(1), "one term: {terms}");
    let exprs = terms[0]["matchExpressions"].as_array().expect("matchExpressions");
    assert_eq!(exprs.len(), 1, "{terms}");
    assert_eq!((&exprs[0]["key"], &exprs[0]["operator"]), (&SITE_LABEL.into(), &"NotIn".into()));
    let excluded: BTreeSet<String> = strings(&exprs[0]["values"]).into_iter().collect();
    assert_eq!(excluded, distinct.into_iter().cloned().collect(), "NotIn must list every site");
    for ds in &sets {
        if site(ds).is_some() {
            assert!(pod_spec(ds)["affinity"].is_null(), "{}: selected by site only", name(ds));
        }
    }
    // Each DaemonSet's selector matches its own pods and no other DaemonSet's.
    for ds in &sets {
        let selector = ds["spec"]["selector"]["matchLabels"].as_object().expect("matchLabels");
        assert!(ds["spec"]["selector"]["matchExpressions"].is_null(), "{}", name(ds));
        for other in &sets {
            let labels = &other["spec"]["template"]["metadata"]["labels"];
            let matches = selector.iter().all(|(k, v)| &labels[k] == v);
            assert_eq!(matches, name(ds) == name(other), "{} selects {}", name(ds), name(other));
        }
        // Every pod keeps the label that monitoring selects (docs/deploy.md's PodMonitor).
        assert_eq!(
            ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"],
            "linkpilot"
        );
    }
}

/// A DaemonSet without what a site changes: its name, its selector and pod labels, its node
/// selection and its policy's ConfigMap.
fn site_neutral(ds: &Value) -> Value {
    let mut v = ds.clone();
    v["metadata"]["name"] = Value::Null;
    v["spec"]["selector"] = Value::Null;
    v["spec"]["template"]["metadata"]["labels"] = Value::Null;
    let pod = &mut v["spec"]["template"]["spec"];
    pod.as_object_mut().expect("pod spec").remove("nodeSelector");
    pod.as_object_mut().expect("pod spec").remove("affinity");
    for volume in pod["volumes"].as_array_mut().expect("volumes") {
        if volume["configMap"].is_object() {
            volume["configMap"]["name"] = Value::Null;
        }
    }
    v
}

#[test]
fn the_site_daemonsets_are_the_default_one_but_for_their_site() {
    let all = resources();
    let sets = daemonsets(&all);
    let default = sets.iter().find(|ds| site(ds).is_none()).expect("the default DaemonSet");
    for ds in sets.iter().filter(|ds| site(ds).is_some()) {
        assert_eq!(
            site_neutral(ds),
            site_neutral(default),
            "{} differs from {} beyond its site",
            name(ds),
            name(default)
        );
    }
}
