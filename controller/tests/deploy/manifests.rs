//! Reading deploy/ (the k8s manifests and examples, as JSON through PyYAML from the project's
//! .venv) and finding things in it: resources by kind, a DaemonSet's site, pod, containers,
//! mounts and command line. Shared by every check, so none of them repeats a lookup.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::Value;

/// The node label that picks a site's DaemonSet.
pub const SITE_LABEL: &str = "linkpilot.io/site";

pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

pub fn venv_tool(name: &str) -> PathBuf {
    let p = repo(".venv/bin").join(name);
    assert!(p.exists(), "{} is missing: run `cargo xtask setup`", p.display());
    p
}

pub fn yaml_files(dir: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo(dir))
        .unwrap_or_else(|e| panic!("{dir}: {e}"))
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

pub fn manifests() -> Vec<PathBuf> {
    yaml_files("deploy/k8s")
}

/// Every document of `files`, as JSON (PyYAML from the same virtualenv reads them).
pub fn documents(files: &[PathBuf]) -> Vec<Value> {
    let out = Command::new(venv_tool("python"))
        .args(["-c", "import json, sys, yaml\nprint(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))"])
        .args(files)
        .output()
        .expect("python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Every resource of deploy/k8s.
pub fn resources() -> Vec<Value> {
    documents(&manifests())
}

pub fn all_of<'a>(all: &'a [Value], kind: &str) -> Vec<&'a Value> {
    let found: Vec<&Value> = all.iter().filter(|r| r["kind"] == kind).collect();
    assert!(!found.is_empty(), "no {kind} in deploy/k8s");
    found
}

pub fn daemonsets(all: &[Value]) -> Vec<&Value> {
    all_of(all, "DaemonSet")
}

pub fn name(r: &Value) -> &str {
    r["metadata"]["name"].as_str().expect("metadata.name")
}

/// The site a DaemonSet's nodeSelector picks; None: the DaemonSet of the nodes in no site.
pub fn site(ds: &Value) -> Option<String> {
    let selector = &ds["spec"]["template"]["spec"]["nodeSelector"];
    selector.as_object().map(|m| {
        assert_eq!(m.len(), 1, "{}: select nodes by {SITE_LABEL} alone: {selector}", name(ds));
        selector[SITE_LABEL]
            .as_str()
            .unwrap_or_else(|| panic!("{}: nodeSelector without {SITE_LABEL}", name(ds)))
            .to_owned()
    })
}

pub fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no container {name}"))
}

pub fn init_container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["initContainers"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("no init container {name}"))
}

pub fn pod_spec(ds: &Value) -> &Value {
    &ds["spec"]["template"]["spec"]
}

pub fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
}

/// The volume a container mounts at `path`, and its mount.
pub fn mounted_at<'a>(pod: &'a Value, c: &'a Value, path: &str) -> (&'a Value, &'a Value) {
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

/// The container's command line with the downward API's $(VAR) replaced.
pub fn command_line(c: &Value) -> Vec<String> {
    let mut line = strings(&c["command"]);
    line.extend(strings(&c["args"]).into_iter().map(|a| a.replace("$(NODE_IP)", "198.18.0.1")));
    line
}

/// The value after `flag` on a command line.
pub fn flag<'a>(line: &'a [String], flag: &str) -> &'a str {
    let at = line.iter().position(|a| a == flag).unwrap_or_else(|| panic!("no {flag}: {line:?}"));
    &line[at + 1]
}

/// The directory of `path` and its file name.
pub fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or_else(|| panic!("{path}: not an absolute path"))
}
