//! The Kubernetes manifests (deploy/k8s, and the training pod of deploy/examples) against the
//! Kubernetes schemas, offline (`kubernetes-validate` from the project's .venv, installed by
//! `cargo xtask setup`), and against what they deploy: the systemd unit's capabilities and stop
//! timeout, the binary's command line, the shipped default policy, every site's policy, one
//! daemon per node, the tuner plugin's path from the image to the training pods; and
//! deploy/Containerfile's stages against each other (tests/tests/image.rs builds it for real).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
};

use linkpilot::{
    actuate::envfile::DEFAULT_TUNER,
    board::{job_reports, tuner_stats},
    control::Policy,
};
use serde_json::Value;

/// The Kubernetes release whose schemas the manifests must satisfy.
const KUBERNETES: &str = "1.37.0";
/// The node label that picks a site's DaemonSet.
const SITE_LABEL: &str = "linkpilot.io/site";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn venv_tool(name: &str) -> PathBuf {
    let p = repo(".venv/bin").join(name);
    assert!(p.exists(), "{} is missing: run `cargo xtask setup`", p.display());
    p
}

fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn manifests() -> Vec<PathBuf> {
    yaml_files("deploy/k8s")
}

/// Every document of `files`, as JSON (PyYAML from the same virtualenv reads them).
fn documents(files: &[PathBuf]) -> Vec<Value> {
    let out = Command::new(venv_tool("python"))
        .args(["-c", "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))"])
        .args(files)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Every resource of deploy/k8s.
fn resources() -> Vec<Value> {
    documents(&manifests())
}

fn all_of<'a>(all: &'a [Value], kind: &str) -> Vec<&'a Value> {
    let found: Vec<&Value> = all.iter().filter(|r| r["kind"] == kind).collect();
    assert!(!found.is_empty(), "no {kind} in deploy/k8s");
    found
}

fn daemonsets(all: &[Value]) -> Vec<&Value> {
    all_of(all, "DaemonSet")
}

fn name(r: &Value) -> &str {
    r["metadata"]["name"].as_str().expect("metadata.name")
}

/// The site a DaemonSet's nodeSelector picks; None: the DaemonSet of the nodes in no site.
fn site(ds: &Value) -> Option<String> {
    let selector = &ds["spec"]["template"]["spec"]["nodeSelector"];
    selector.as_object().map(|m| {
        assert_eq!(m.len(), 1, "{}: select nodes by {SITE_LABEL} alone: {selector}", name(ds));
        selector[SITE_LABEL]
            .as_str()
            .unwrap_or_else(|| panic!("{}: nodeSelector without {SITE_LABEL}", name(ds)))
            .to_owned()
    })
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn init_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no init container {name}"))
}

fn pod_spec(ds: &Value) -> &Value {
    &ds["spec"]["template"]["spec"]
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
}

/// The volume a container mounts at `path`, and its mount.
fn mounted_at<'a>(pod: &'a Value, c: &'a Value, path: &str) -> (&'a Value, &'a Value) {
    let mount = c["volumeMounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["mountPath"] == path))
        .unwrap_or_else(|| panic!("{}: nothing mounted at {path}", c["name"]));
    let volume = pod["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("no volume {}", mount["name"]));
    (volume, mount)
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
    let mut files = manifests();
    assert!(files.len() >= 3, "{files:?}");
    files.extend(yaml_files("deploy/examples"));
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
    assert_eq!(passed, documents(&files).len(), "{said}");
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

/// The container's command line with the downward API's $(VAR) replaced.
fn command_line(c: &Value) -> Vec<String> {
    let mut line = strings(&c["command"]);
    line.extend(strings(&c["args"]).into_iter().map(|a| a.replace("$(NODE_IP)", "198.18.0.1")));
    line
}

/// The value after `flag` on a command line.
fn flag<'a>(line: &'a [String], flag: &str) -> &'a str {
    let at = line.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag}: {line:?}"));
    &line[at + 1]
}

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

/// The directory of `path` and its file name.
fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or_else(|| panic!("{path}: not an absolute path"))
}

#[test]
fn the_tuner_plugin_reaches_training_pods_at_the_path_nccl_env_names() {
    let all = resources();
    let mut named = BTreeSet::new();
    for ds in daemonsets(&all) {
        let pod = pod_spec(ds);
        // nccl.env names --nccl-tuner: a file under the host's /run/linkpilot ...
        let tuner = flag(&command_line(container(pod, "linkpilot")), "--nccl-tuner").to_owned();
        assert!(tuner.starts_with("/run/linkpilot/"), "{}: {tuner}", name(ds));
        // ... which an init container copies there from the image's copy (the daemon's default
        // --nccl-tuner, where deploy/Containerfile installs it), through the same volume.
        let init = init_container(pod, "install-tuner");
        let script = command_line(init).join(" ");
        let (dir, file) = split(&tuner);
        for part in [DEFAULT_TUNER, dir, file] {
            assert!(script.contains(part), "{}: install-tuner never names {part}", name(ds));
        }
        let (volume, mount) = mounted_at(pod, init, "/run/linkpilot");
        assert_eq!(volume["hostPath"]["path"], "/run/linkpilot");
        assert_ne!(mount["readOnly"], true, "install-tuner writes there");
        named.insert(tuner);
    }
    assert_eq!(named.len(), 1, "one place for the plugin on every node: {named:?}");
    let tuner = named.pop_first().expect("the plugin");

    // The training pod sees the same host directory at the same path, read-only but for the
    // two directories its processes write to (made by the daemon: never created by kubelet).
    let pods = documents(&yaml_files("deploy/examples"));
    let pod = &pods.iter().find(|r| r["kind"] == "Pod").expect("a training pod")["spec"];
    let c = &pod["containers"][0];
    let (volume, mount) = mounted_at(pod, c, "/run/linkpilot");
    assert_eq!(volume["hostPath"]["path"], "/run/linkpilot");
    assert_eq!(mount["readOnly"], true, "the board and nccl.env are the daemon's");
    assert!(tuner.starts_with(&format!("{}/", mount["mountPath"].as_str().expect("path"))));
    for dir in [tuner_stats::DEFAULT_DIR, job_reports::DEFAULT_DIR] {
        let (volume, mount) = mounted_at(pod, c, dir);
        assert_eq!(volume["hostPath"]["path"], dir);
        assert_eq!(volume["hostPath"]["type"], "Directory", "{dir}: kubelet would make it root's");
        assert_ne!(mount["readOnly"], true, "{dir} must be writable");
    }
}

/// One stage of deploy/Containerfile (`FROM ... AS name`, or the last one for None), from the
/// line after its FROM.
fn stage(name: Option<&str>) -> String {
    let text = std::fs::read_to_string(repo("deploy/Containerfile")).expect("Containerfile");
    let stages: Vec<&str> = text.split("\nFROM ").skip(1).collect();
    let body = match name {
        Some(s) => stages
            .iter()
            .find(|b| b.lines().next().is_some_and(|l| l.ends_with(&format!(" AS {s}"))))
            .unwrap_or_else(|| panic!("no stage {s}")),
        None => stages.last().expect("a stage"),
    };
    body.split_once('\n').map_or("", |(_, rest)| rest).to_owned()
}

/// The `COPY` lines of a stage, as (sources, destination, --from).
fn copies(stage: &str) -> Vec<(Vec<String>, String, Option<String>)> {
    stage
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .map(|l| {
            let mut words: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            let from = words.first().and_then(|w| w.strip_prefix("--from=")).map(str::to_owned);
            if from.is_some() {
                words.remove(0);
            }
            let dest = words.pop().expect("a destination");
            (words, dest, from)
        })
        .collect()
}

/// Where a COPY puts `source`: into `dest` if it names a directory.
fn installed_at(source: &str, dest: &str) -> String {
    if dest.ends_with('/') {
        format!("{dest}{}", split(source).1)
    } else {
        dest.to_owned()
    }
}

#[test]
fn the_containerfiles_stages_ship_the_same_files_from_sources_that_exist() {
    // Built here, or copied from a host build: the same files at the same paths, the tuner
    // plugin where the daemon looks by default.
    let built = copies(&stage(None));
    let prebuilt = copies(&stage(Some("runtime-prebuilt")));
    let paths = |c: &[(Vec<String>, String, Option<String>)]| -> BTreeSet<String> {
        c.iter().flat_map(|(s, d, _)| s.iter().map(|s| installed_at(s, d))).collect()
    };
    assert_eq!(paths(&built), paths(&prebuilt));
    assert!(paths(&built).contains(DEFAULT_TUNER), "{:?}", paths(&built));
    assert!(paths(&built).contains("/usr/local/bin/linkpilot"));
    // The last stage's files come from the build stage, which installs each of them.
    let build = stage(Some("build"));
    for (sources, _, from) in &built {
        assert_eq!(from.as_deref(), Some("build"), "{sources:?}");
        for s in sources {
            assert!(build.contains(&format!(" {s}")), "the build stage never makes {s}");
        }
    }
    // The prebuilt stage's sources are in the context: files a host build makes under target/
    // (which .dockerignore lets through, one by one), or files of the repository.
    let ignore = std::fs::read_to_string(repo(".dockerignore")).expect(".dockerignore");
    for (sources, _, from) in &prebuilt {
        assert!(from.is_none(), "{sources:?} from the context");
        for s in sources {
            if s.starts_with("target/") {
                assert!(ignore.lines().any(|l| l == format!("!{s}")), ".dockerignore drops {s}");
            } else {
                assert!(repo(s).exists(), "{s} does not exist");
            }
        }
    }
    // The zig the build stage fetches is the one `cargo xtask setup` pins.
    let python = std::fs::read_to_string(repo("xtask/src/python.rs")).expect("python.rs");
    let zig = build.split_whitespace().find(|w| w.starts_with("ziglang==")).expect("ziglang pin");
    assert!(python.contains(&format!("\"{zig}\"")), "xtask/src/python.rs pins another {zig}");
}
