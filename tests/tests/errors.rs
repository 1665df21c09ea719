//! Bad input and missing prerequisites: one clear error, exit status 1, nothing attached.

use std::process::Command;

use linkpilot_tests::{
    linkpilot_bin,
    netns::Netns,
    oracle::{loaded_after_exit, ours_loaded},
    run,
};

/// Runs linkpilot (after `prefix`), checking that it left no program of ours loaded.
fn linkpilot(prefix: &[&str], args: &[&str]) -> (i32, String) {
    let bin = linkpilot_bin();
    let bin = bin.to_str().expect("utf-8 path");
    let full: Vec<&str> = prefix.iter().copied().chain([bin]).chain(args.iter().copied()).collect();
    let before = ours_loaded();
    let out = run(&full);
    let left = loaded_after_exit(|p| !before.contains(p));
    assert!(left.is_empty(), "{args:?} left loaded: {left:?}");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn missing_interface() {
    let ns = Netns::new("err");
    let (code, err) = linkpilot(
        &["nsenter", &format!("--net=/run/netns/{}", ns.name)],
        &["watch", "--iface", "lpnope0"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("interface \"lpnope0\" does not exist"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn missing_privileges() {
    let (code, err) = linkpilot(
        &["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"],
        &["watch", "--iface", "lo"],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("missing privileges") && err.contains("CAP_BPF"), "{err}");
}

/// Runs `script` under `sh` in a mount namespace of its own (so what it unmounts or hides stays
/// as it is for the host) and asserts that none of our programs is left loaded after it.
fn in_private_mounts_leaving_nothing_loaded(script: &str) -> std::process::Output {
    let before = ours_loaded();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", script])
        .output()
        .expect("unshare");
    let left = loaded_after_exit(|p| !before.contains(p));
    assert!(left.is_empty(), "left loaded: {left:?}");
    out
}

#[test]
fn missing_tracefs() {
    // A private mount namespace, so the host's tracefs stays mounted; without CAP_SYS_ADMIN,
    // so that linkpilot cannot mount its own either.
    let script = format!(
        "umount -l /sys/kernel/tracing 2>/dev/null; umount -l /sys/kernel/debug 2>/dev/null; \
         exec setpriv --bounding-set=-sys_admin {} watch --iface lo --count 1",
        linkpilot_bin().display()
    );
    let out = in_private_mounts_leaving_nothing_loaded(&script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("tracefs is not mounted") && err.contains("mount -t tracefs"), "{err}");
    assert!(err.contains("a mount namespace of our own: EPERM"), "{err}");
}

#[test]
fn bad_arguments() {
    for args in [&["watch"][..], &["watch", "--iface", "lo", "--count", "0"], &["nonsense"]] {
        let (code, err) = linkpilot(&[], args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("error:") && !err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn no_rdma_devices_is_reported_cleanly() {
    let (code, _) = linkpilot(&[], &["rdma", "--root", "/nonexistent/infiniband"]);
    assert_eq!(code, 0);
    let out = run(&[
        linkpilot_bin().to_str().expect("utf-8"),
        "rdma",
        "--root",
        "/nonexistent/infiniband",
    ]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no RDMA devices"), "{out:?}");
    // The fixture tree of a ConnectX NIC, as JSON.
    let fixture = linkpilot_tests::rdma::SYSFS_FIXTURE;
    let out = run(&[linkpilot_bin().to_str().expect("utf-8"), "rdma", "--root", fixture, "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["ports"][0]["signals"]["rp_cnp_handled"], 5121, "{v}");
    // libibverbs finds nothing on a machine without RDMA, and says so rather than failing.
    assert_eq!(v["verbs"]["devices"], serde_json::json!([]), "{v}");
}

/// A kernel without BTF (here hidden by a tmpfs over /sys/kernel/btf in a mount namespace of
/// its own): the programs still load and run, and the start says what is lost.
#[test]
fn missing_btf_is_said_and_the_programs_run_without_it() {
    let script = format!(
        "mount -t tmpfs none /sys/kernel/btf && exec {} watch --iface lo --count 1",
        linkpilot_bin().display()
    );
    let out = in_private_mounts_leaving_nothing_loaded(&script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("lo"), "one reading of lo");
    for lost in [
        "retransmissions are counted per skb, not per segment: reading /sys/kernel/btf/vmlinux",
        "TCP events of other network namespaces with the same addresses are counted too",
    ] {
        assert!(err.contains(lost), "{lost:?} not said: {err}");
    }
}
