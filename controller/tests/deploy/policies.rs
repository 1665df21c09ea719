//! Each DaemonSet's command line against the binary's own parser, and the policy it names:
//! its ConfigMap's, checked by `linkpilot policy check` as the init container runs it, the
//! shipped default where no site is selected, a policy naming peers for a site.

use std::{collections::BTreeSet, process::Command};

use linkpilot::control::Policy;
use serde_json::Value;

use crate::manifests::*;

/// `linkpilot policy check` of `text`, as the init container runs it; the policy as parsed.
fn policy_checks(text: &str, what: &str) -> Policy {
    let tmp = std::env::temp_dir().join(format!("lp-{}-{what}.toml", std::process::id()));
    std::fs::write(&tmp, text).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
        .args(["policy", "check"])
        .arg(&tmp)
        .output()
        .expect("policy check");
    let policy = Policy::load(&tmp);
    let _ = std::fs::remove_file(&tmp);
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stdout));
    policy.unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn every_daemonsets_args_parse_and_its_configmaps_policy_checks() {
    let all = resources();
    let mut mounted = BTreeSet::new();
    for ds in daemonsets(&all) {
        let pod = pod_spec(ds);
        let c = container(pod, "linkpilot");
        let env = strings(&Value::Array(
            c["env"].as_array().into_iter().flatten().map(|e| e["name"].clone()).collect(),
        ));
        assert!(env.contains(&"NODE_IP".to_owned()), "$(NODE_IP) needs its env entry");
        // Every site starts observing; the operator switches it with `kubectl set env`.
        let dry =
            c["env"].as_array().into_iter().flatten().find(|e| e["name"] == "LINKPILOT_DRY_RUN");
        let dry = dry.and_then(|e| e["value"].as_str());
        assert_eq!(dry, Some("true"), "{}: rolled out observing first", name(ds));
        // Both values the rollout uses are ones the binary takes (a bad one stops it at start).
        for value in ["true", "false", "bogus"] {
            let out = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
                .args(["run", "--policy", "/nonexistent/linkpilot-policy.toml"])
                .env("LINKPILOT_DRY_RUN", value)
                .output()
                .expect("linkpilot");
            let err = String::from_utf8_lossy(&out.stderr);
            let parsed = !err.contains("invalid value");
            assert_eq!(parsed, value != "bogus", "{value}: {err}");
            assert!(!out.status.success(), "{err}");
        }
        let line = command_line(c);
        assert_eq!(line[0], "/usr/local/bin/linkpilot");
        // The binary's own parser: every flag known, every value valid (then --help exits 0).
        let out = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
            .args(&line[1..])
            .arg("--help")
            .output()
            .expect("linkpilot");
        assert!(out.status.success(), "{line:?}: {}", String::from_utf8_lossy(&out.stderr));
        assert!(!flag(&line, "--metrics-addr").starts_with("127."), "Prometheus cannot reach it");

        // The policy it names is its ConfigMap's, which checks OK.
        let policy = flag(&line, "--policy");
        let (dir, file) = policy.rsplit_once('/').expect("a path");
        let (volume, _) = mounted_at(pod, c, dir);
        let cm_name = volume["configMap"]["name"].as_str().expect("a ConfigMap volume");
        let cm = all
            .iter()
            .find(|r| r["kind"] == "ConfigMap" && name(r) == cm_name)
            .unwrap_or_else(|| panic!("{}: no ConfigMap {cm_name}", name(ds)));
        let text = cm["data"][file].as_str().unwrap_or_else(|| panic!("{cm_name} has no {file}"));
        let parsed = policy_checks(text, cm_name);
        match site(ds) {
            // The nodes in no site run the shipped default, which only observes.
            None => {
                let shipped =
                    std::fs::read_to_string(repo("policies/default.toml")).expect("default");
                assert_eq!(text, shipped, "{cm_name} drifted from policies/default.toml");
                assert!(!parsed.names_peers(), "the default policy acts");
            }
            // A site's policy names the peers its links reach: it acts.
            Some(site) => assert!(parsed.names_peers(), "{cm_name} (site {site}) names no peers"),
        }
        assert!(mounted.insert(cm_name.to_owned()), "{cm_name} is mounted by two DaemonSets");
        // The init container checks the same file.
        let init = init_container(pod, "policy-check");
        assert_eq!(strings(&init["args"]), ["policy", "check", policy], "{}", name(ds));
        assert_eq!(pod["initContainers"][0]["name"], "policy-check", "checked before all else");
    }
    // And every ConfigMap is some DaemonSet's, and each of its policies checks.
    for cm in all_of(&all, "ConfigMap") {
        assert!(mounted.contains(name(cm)), "{}: no DaemonSet mounts it", name(cm));
        for (file, text) in cm["data"].as_object().expect("data") {
            assert!(file.ends_with(".toml"), "{}: {file} is not a policy", name(cm));
            policy_checks(text.as_str().expect("text"), &format!("{}-{file}", name(cm)));
        }
    }
}
