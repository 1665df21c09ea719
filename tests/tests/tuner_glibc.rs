//! The NCCL tuner plugin as shipped (`cargo xtask build-tuner`, which `cargo xtask test` passes as
//! LINKPILOT_SHIPPED_TUNER) loads where the training images are old: it names no glibc symbol
//! version above 2.28 (RHEL 8), as objdump reads its dynamic symbols, and loads here as NCCL
//! loads it, with all its entry points and the gate.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
};

use linkpilot_tests::shipped_tuner;

#[test]
fn the_shipped_plugin_needs_no_glibc_newer_than_2_28() {
    let so = shipped_tuner();
    let out = Command::new("objdump").arg("-T").arg(&so).output().expect("objdump");
    assert!(out.status.success(), "objdump -T {}", so.display());
    let text = String::from_utf8_lossy(&out.stdout);
    let versions: Vec<(u32, u32)> = text
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut p = v.split('.');
            Some((p.next()?.parse().ok()?, p.next().unwrap_or("0").parse().ok()?))
        })
        .collect();
    let highest = versions.iter().max().copied().expect("GLIBC symbol versions");
    assert!(highest <= (2, 28), "{} needs GLIBC_{}.{}", so.display(), highest.0, highest.1);
    // And NCCL's loader takes it: symbols v6 -> v5 -> v4 and the gate, called from C.
    let dir = std::env::temp_dir().join(format!("lp-tuner-glibc-{}", std::process::id()));
    let bin = linkpilot_tests::tuner::harness(&dir);
    let mut child = Command::new(&bin)
        .arg(&so)
        .env("LINKPILOT_TUNER_STATS", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the harness");
    let mut stdin = child.stdin.take().expect("stdin");
    writeln!(stdin, "abi\nadopt 0 2 4 1 1048576 2097152 1\ninit 6 1 16 2\nwithdraw")
        .expect("stdin");
    drop(stdin);
    let lines: Vec<String> = BufReader::new(child.stdout.take().expect("stdout"))
        .lines()
        .map_while(Result::ok)
        .filter(|l| l != "." && !l.starts_with("log "))
        .collect();
    assert!(child.wait().expect("exit").success());
    assert_eq!(lines[0], "loaded v6");
    assert_eq!(lines[1], "abi name linkpilot linkpilot linkpilot sizes 40 32 32 shared ok");
    assert_eq!(lines[2], "rc 0", "the gate took a decision: {lines:?}");
    assert!(lines[3].starts_with("ctx 0 rc 0 null 0"), "{lines:?}");
    assert_eq!(lines[4], "rc 0", "{lines:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
