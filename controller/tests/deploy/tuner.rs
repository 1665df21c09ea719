//! The NCCL tuner plugin's path from the image to the training pods: the install-tuner init
//! container copies it where the daemon's --nccl-tuner names it, and the example training pod
//! mounts that host directory at the same path.

use std::collections::BTreeSet;

use linkpilot::{
    actuate::envfile::DEFAULT_TUNER,
    board::{job_reports, tuner_stats},
};

use crate::manifests::*;

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
