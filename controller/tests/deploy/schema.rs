//! The manifests and the example training pod against the Kubernetes schemas, offline, with
//! `kubernetes-validate`: the one check that asks an outside tool, not our own reading.

use std::process::Command;

use crate::manifests::*;

/// The Kubernetes release whose schemas the manifests must satisfy.
const KUBERNETES: &str = "1.37.0";

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
