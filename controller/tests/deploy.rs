//! The Kubernetes manifests (deploy/k8s) against the Kubernetes schemas, offline
//! (`kubernetes-validate` from the project's .venv, installed by `cargo xtask setup`), and
//! against what they deploy: the systemd unit's capabilities and stop timeout, the binary's
//! command line, the shipped default policy.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// The Kubernetes release whose schemas the manifests must satisfy.
const KUBERNETES: &str = "1.37.0";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn venv_tool(name: &str) -> PathBuf {
    let p = repo(".venv/bin").join(name);
    assert!(p.exists(), "{} is missing: run `cargo xtask setup`", p.display());
    p
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo("deploy/k8s"))
        .expect("deploy/k8s")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// Every document of every manifest, as JSON (PyYAML from the same virtualenv reads them).
fn resources() -> Vec<Value> {
    let out = Command::new(venv_tool("python"))
        .args(["-c", "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))"])
        .args(manifests())
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn find<'a>(all: &'a [Value], kind: &str) -> &'a Value {
    all.iter().find(|r| r["kind"] == kind).unwrap_or_else(|| panic!("no {kind} in deploy/k8s"))
}

fn container<'a>(ds: &'a Value, name: &str) -> &'a Value {
    ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
}

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
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let files = manifests();
    assert!(files.len() >= 3, "{files:?}");
    let out = Command::new(venv_tool("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", KUBERNETES])
        .args(&files)
        .output()
        .expect("kubernetes-validate");
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{said}");
    // One "passed" line per resource: nothing skipped for want of a schema.
    let passed = said.lines().filter(|l| l.contains(" passed for resource ")).count();
    assert_eq!(passed, resources().len(), "{said}");
}

#[test]
fn the_daemonset_has_the_units_capabilities_and_nothing_more() {
    let all = resources();
    let ds = find(&all, "DaemonSet");
    let sc = &container(ds, "linkpilot")["securityContext"];
    let unit_caps: BTreeSet<String> = unit("CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.strip_prefix("CAP_").expect("CAP_ name").to_owned())
        .collect();
    let added: BTreeSet<String> = strings(&sc["capabilities"]["add"]).into_iter().collect();
    assert_eq!(added, unit_caps, "the DaemonSet's capabilities against the unit's");
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(
        (&sc["privileged"], &sc["allowPrivilegeEscalation"]),
        (&false.into(), &false.into())
    );
    // Every container, the policy check too, is unprivileged.
    for c in ds["spec"]["template"]["spec"]["initContainers"].as_array().into_iter().flatten() {
        assert_eq!(
            strings(&c["securityContext"]["capabilities"]["drop"]),
            ["ALL"],
            "{}",
            c["name"]
        );
        assert!(c["securityContext"]["capabilities"]["add"].is_null(), "{}", c["name"]);
    }
    // The SIGTERM rollback gets at least the unit's stop timeout.
    let stop: u64 = unit("TimeoutStopSec").trim_end_matches('s').parse().expect("seconds");
    let grace = ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"].as_u64();
    assert!(grace.is_some_and(|g| g >= stop), "terminationGracePeriodSeconds {grace:?} < {stop}");
    assert_eq!(ds["spec"]["template"]["spec"]["hostNetwork"], true);
}

#[test]
fn run_directory_is_the_hosts_run_linkpilot() {
    let all = resources();
    let spec = &find(&all, "DaemonSet")["spec"]["template"]["spec"];
    assert_eq!(unit("RuntimeDirectory"), "linkpilot", "the unit's /run/linkpilot");
    let mount = container(find(&all, "DaemonSet"), "linkpilot")["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == "/run/linkpilot"))
        .expect("a mount at /run/linkpilot");
    let volume = spec["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .expect("its volume");
    assert_eq!(volume["hostPath"]["path"], "/run/linkpilot", "{volume}");
}

/// The container's command line with the downward API's $(VAR) replaced.
fn command_line(c: &Value) -> Vec<String> {
    let mut line = strings(&c["command"]);
    line.extend(strings(&c["args"]).into_iter().map(|a| a.replace("$(NODE_IP)", "198.18.0.1")));
    line
}

#[test]
fn the_args_parse_and_the_configmaps_policy_is_the_shipped_default_and_checks() {
    let all = resources();
    let ds = find(&all, "DaemonSet");
    let c = container(ds, "linkpilot");
    let env = strings(&Value::Array(
        c["env"].as_array().into_iter().flatten().map(|e| e["name"].clone()).collect(),
    ));
    assert!(env.contains(&"NODE_IP".to_owned()), "$(NODE_IP) needs its env entry");
    let line = command_line(c);
    assert_eq!(line[0], "/usr/local/bin/linkpilot");
    // The binary's own parser: every flag known, every value valid (then --help exits 0).
    let out = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
        .args(&line[1..])
        .arg("--help")
        .output()
        .expect("linkpilot");
    assert!(out.status.success(), "{line:?}: {}", String::from_utf8_lossy(&out.stderr));
    let metrics = line.iter().position(|a| a == "--metrics-addr").expect("--metrics-addr");
    assert!(!line[metrics + 1].starts_with("127."), "Prometheus cannot reach loopback");

    // The policy it names is the ConfigMap's, which is policies/default.toml and checks OK.
    let policy = &line[line.iter().position(|a| a == "--policy").expect("--policy") + 1];
    let (dir, file) = policy.rsplit_once('/').expect("a path");
    let mount = c["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == dir))
        .unwrap_or_else(|| panic!("nothing mounted at {dir}"));
    let volume = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .expect("the policy volume");
    let cm_name = &volume["configMap"]["name"];
    let cm = all
        .iter()
        .find(|r| r["kind"] == "ConfigMap" && &r["metadata"]["name"] == cm_name)
        .unwrap_or_else(|| panic!("no ConfigMap {cm_name}"));
    let text = cm["data"][file].as_str().unwrap_or_else(|| panic!("{cm_name} has no {file}"));
    let shipped = std::fs::read_to_string(repo("policies/default.toml")).expect("default policy");
    assert_eq!(text, shipped, "the ConfigMap's policy drifted from policies/default.toml");
    let tmp = std::env::temp_dir().join(format!("lp-{}-configmap-policy.toml", std::process::id()));
    std::fs::write(&tmp, text).expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_linkpilot"))
        .args(["policy", "check"])
        .arg(&tmp)
        .output()
        .expect("policy check");
    let _ = std::fs::remove_file(&tmp);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    // The init container checks the same file.
    let init = &ds["spec"]["template"]["spec"]["initContainers"][0];
    assert_eq!(strings(&init["args"]), ["policy", "check", policy.as_str()]);
}
