//! deploy/Containerfile built for real, with buildah (root, chroot isolation), and the image
//! used as the DaemonSets use it. No image registry is reachable where the tests run, so the
//! runtime's base (BASE) is a Debian 12 that debootstrap makes from Debian's archive, kept in
//! buildah's storage for later runs; the image is the `runtime-prebuilt` stage filled with this
//! workspace's binaries: the debug `linkpilot` the other tests run and the shipped tuner plugin
//! (LINKPILOT_SHIPPED_TUNER). The default stage's in-image build of Rust, bpf-linker and the
//! eBPF object takes far longer than the suite allows; controller/tests/deploy.rs holds its
//! stages to this one's.
//!
//! In the image: the binary runs (its shared libraries are there) and checks the shipped
//! policies; the tuner plugin is the shipped one, at the daemon's default --nccl-tuner; the
//! DaemonSet's install-tuner init container, run from the image, puts it where the DaemonSet's
//! --nccl-tuner says, and the env file then names it there.

use std::{
    path::{Path, PathBuf},
    time::Instant,
};

use linkpilot::actuate::envfile::DEFAULT_TUNER;
use linkpilot_tests::{linkpilot_bin, python, run, sh, shipped_tuner, temp_dir};
use serde_json::Value;

const BASE: &str = "localhost/linkpilot-test-base:bookworm";
const IMAGE: &str = "localhost/linkpilot-test:prebuilt";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

/// `buildah ARGS` (chroot isolation for `run`: no OCI runtime, no cgroup setup needed).
fn buildah(args: &[&str]) -> String {
    let mut all = vec!["buildah"];
    all.extend_from_slice(args);
    sh(&all).trim().to_owned()
}

/// Prints how long each step took: the suite's time budget is tight.
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let out = f();
    eprintln!("image: {what}: {:.1} s", t.elapsed().as_secs_f64());
    out
}

/// A Debian 12 base image, made once per machine: debootstrap's minimal system, committed.
fn base_image() {
    if run(&["buildah", "inspect", "--type", "image", BASE]).status.success() {
        return;
    }
    let root = temp_dir("image-rootfs");
    timed("debootstrap", || {
        sh(&["debootstrap", "--variant=minbase", "bookworm", root.to_str().expect("path")])
    });
    timed("the base image", || {
        let ctr = buildah(&["from", "scratch"]);
        let mnt = buildah(&["mount", &ctr]);
        sh(&["cp", "-a", &format!("{}/.", root.display()), &mnt]);
        buildah(&["umount", &ctr]);
        buildah(&["commit", "--quiet", &ctr, BASE]);
        buildah(&["rm", &ctr]);
    });
    let _ = std::fs::remove_dir_all(&root);
}

/// The `COPY` sources of the runtime-prebuilt stage.
fn prebuilt_sources() -> Vec<String> {
    let text = std::fs::read_to_string(repo("deploy/Containerfile")).expect("Containerfile");
    let stage = text
        .split("\nFROM ")
        .find(|s| s.lines().next().is_some_and(|l| l.ends_with(" AS runtime-prebuilt")))
        .expect("a runtime-prebuilt stage");
    stage
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .flat_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words[..words.len() - 1].iter().map(|w| (*w).to_owned()).collect::<Vec<_>>()
        })
        .collect()
}

/// A build context holding what the stage copies: the binaries under test where a host's
/// release build puts them, the rest from the repository.
fn context(dir: &Path) {
    for source in prebuilt_sources() {
        let from = match source.as_str() {
            "target/release/linkpilot" => linkpilot_bin(),
            s if s.starts_with("target/nccl-tuner/") => shipped_tuner(),
            s if s.starts_with("target/") => panic!("{s}: which build makes it?"),
            s => repo(s),
        };
        let to = dir.join(&source);
        std::fs::create_dir_all(to.parent().expect("parent")).expect("dir");
        std::fs::copy(&from, &to).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    }
}

/// Working containers, removed with the image when the test ends.
struct Containers(Vec<String>);

impl Containers {
    fn from(&mut self, image: &str) -> String {
        let ctr = buildah(&["from", "--pull-never", image]);
        self.0.push(ctr.clone());
        ctr
    }
}

impl Drop for Containers {
    fn drop(&mut self) {
        for ctr in &self.0 {
            let _ = run(&["buildah", "rm", ctr]);
        }
        let _ = run(&["buildah", "rmi", IMAGE]);
    }
}

/// `buildah run` of `cmd` in `ctr` with `volumes` (HOST:CONTAINER[:ro]); its stdout.
fn inside(ctr: &str, volumes: &[String], cmd: &[&str]) -> String {
    let mut args = vec!["run", "--isolation", "chroot"];
    for v in volumes {
        args.extend(["--volume", v]);
    }
    args.push(ctr);
    args.push("--");
    args.extend_from_slice(cmd);
    buildah(&args)
}

/// The default DaemonSet's install-tuner command line and its daemon's args (PyYAML from the
/// project's .venv reads the manifest).
fn daemonset() -> (Vec<String>, Vec<String>) {
    let out = sh(&[
        python().to_str().expect("path"),
        "-c",
        "import json, sys, yaml\n\
         ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d['kind'] == 'DaemonSet')\n\
         pod = ds['spec']['template']['spec']\n\
         init = next(c for c in pod['initContainers'] if c['name'] == 'install-tuner')\n\
         main = next(c for c in pod['containers'] if c['name'] == 'linkpilot')\n\
         print(json.dumps([init['command'] + init['args'], main['args']]))",
        repo("deploy/k8s/daemonset.yaml").to_str().expect("path"),
    ]);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array().expect("array").iter().map(|s| s.as_str().expect("str").to_owned()).collect()
    };
    (strings(&v[0]), strings(&v[1]))
}

fn env_var<'a>(env: &'a str, name: &str) -> Option<&'a str> {
    env.lines().find_map(|l| l.strip_prefix(&format!("{name}=")))
}

#[test]
fn the_prebuilt_image_runs_the_daemon_and_installs_the_tuner_plugin() {
    let dir = temp_dir("image");
    timed("the base image, if missing", base_image);
    let ctx = dir.join("context");
    context(&ctx);
    let mut containers = Containers(Vec::new());
    timed("buildah bud --target runtime-prebuilt", || {
        buildah(&[
            "bud",
            "--isolation",
            "chroot",
            "--pull-never",
            "--quiet",
            "--build-arg",
            &format!("BASE={BASE}"),
            "--target",
            "runtime-prebuilt",
            "--file",
            repo("deploy/Containerfile").to_str().expect("path"),
            "--tag",
            IMAGE,
            ctx.to_str().expect("path"),
        ])
    });
    let config: Value =
        serde_json::from_str(&buildah(&["inspect", "--type", "image", IMAGE])).expect("JSON");
    let entrypoint = &config["OCIv1"]["config"]["Entrypoint"];
    assert_eq!(entrypoint, &serde_json::json!(["/usr/local/bin/linkpilot"]), "{entrypoint}");
    let ctr = containers.from(IMAGE);

    // The files are the ones under test, at the paths the DaemonSets and the daemon expect.
    let mnt = PathBuf::from(buildah(&["mount", &ctr]));
    let in_image = |p: &str| std::fs::read(mnt.join(p.trim_start_matches('/'))).expect(p);
    let same = |a: Vec<u8>, b: &Path| a == std::fs::read(b).expect("file");
    assert!(same(in_image("/usr/local/bin/linkpilot"), &linkpilot_bin()), "the binary differs");
    assert!(same(in_image(DEFAULT_TUNER), &shipped_tuner()), "{DEFAULT_TUNER} differs");
    buildah(&["umount", &ctr]);

    // It runs: libibverbs and libnl are in the runtime stage.
    let version = timed("linkpilot --version", || {
        inside(&ctr, &[], &["/usr/local/bin/linkpilot", "--version"])
    });
    assert_eq!(version, sh(&[linkpilot_bin().to_str().expect("path"), "--version"]).trim());
    let policies = format!("{}:/etc/linkpilot:ro", repo("policies").display());
    let checked = inside(
        &ctr,
        std::slice::from_ref(&policies),
        &["/usr/local/bin/linkpilot", "policy", "check", "/etc/linkpilot/default.toml"],
    );
    assert!(checked.contains(": OK (sha256 "), "{checked}");
    // The daemon's default --nccl-tuner finds the image's plugin.
    let env = inside(
        &ctr,
        std::slice::from_ref(&policies),
        &["/usr/local/bin/linkpilot", "env", "--policy", "/etc/linkpilot/hk-us.toml"],
    );
    assert_eq!(env_var(&env, "NCCL_TUNER_PLUGIN"), Some(DEFAULT_TUNER), "{env}");

    // The DaemonSet's install-tuner into a directory standing for the host's /run/linkpilot.
    let (install, args) = daemonset();
    let at = args.iter().position(|a| a == "--nccl-tuner").expect("--nccl-tuner");
    let tuner = args[at + 1].strip_prefix("/run/linkpilot/").expect("under /run/linkpilot");
    let host_run = dir.join("run");
    std::fs::create_dir_all(&host_run).expect("dir");
    let volumes = [policies, format!("{}:/run/linkpilot", host_run.display())];
    let install: Vec<&str> = install.iter().map(String::as_str).collect();
    timed("install-tuner", || inside(&ctr, &volumes[1..], &install));
    let installed = host_run.join(tuner);
    assert!(same(std::fs::read(&installed).expect("plugin"), &shipped_tuner()), "{tuner} differs");
    // Again, as after an upgrade: the new file is renamed over the old, so a job that loaded the
    // old one keeps reading what it loaded.
    std::fs::write(&installed, b"an older plugin").expect("write");
    let mut loaded = std::fs::File::open(&installed).expect("open");
    timed("install-tuner, again", || inside(&ctr, &volumes[1..], &install));
    let mut kept = Vec::new();
    std::io::Read::read_to_end(&mut loaded, &mut kept).expect("read");
    assert!(kept == b"an older plugin", "the loaded file was rewritten in place");
    assert!(same(std::fs::read(&installed).expect("plugin"), &shipped_tuner()), "not replaced");
    let lib = host_run.join(tuner).parent().expect("dir").to_owned();
    let left: Vec<_> =
        std::fs::read_dir(&lib).expect("lib").map(|e| e.expect("e").file_name()).collect();
    assert_eq!(left.len(), 1, "the plugin alone: {left:?}");
    // With the DaemonSet's --nccl-tuner, the env file names the installed copy.
    let env = inside(
        &ctr,
        &volumes,
        &[
            "/usr/local/bin/linkpilot",
            "env",
            "--policy",
            "/etc/linkpilot/hk-us.toml",
            "--nccl-tuner",
            &args[at + 1],
        ],
    );
    assert_eq!(env_var(&env, "NCCL_TUNER_PLUGIN"), Some(args[at + 1].as_str()), "{env}");
    drop(containers);
    let _ = std::fs::remove_dir_all(&dir);
}
