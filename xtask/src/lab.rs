//! The WAN lab and the processes around it, as the demo and the benchmarks run them: children
//! that are stopped when dropped, the lab's hosts and its per-second ground truth.

use std::{
    fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::run::workspace_root;

/// A lab host as the lab prints it.
#[derive(Clone, Debug)]
pub struct Host {
    /// "Hk" or "Us".
    pub site: String,
    pub netns: String,
    pub ipv4: String,
}

/// Stops a child when dropped (SIGTERM, then SIGKILL after 10 s), so an error or a Ctrl-C
/// midway leaves nothing running.
pub struct Reaped(pub Child, pub &'static str);

impl Reaped {
    /// Waits for the child to exit by itself until `deadline`; `None` if it is still running.
    pub fn wait_until(&mut self, deadline: Instant) -> Option<std::process::ExitStatus> {
        loop {
            if let Ok(Some(status)) = self.0.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.0.try_wait() {
            return;
        }
        // SIGTERM first: the daemon and the lab clean up after themselves on it.
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        if self.wait_until(Instant::now() + Duration::from_secs(10)).is_some() {
            return;
        }
        eprintln!("{} did not stop on SIGTERM; killing it", self.1);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    })
}

pub fn bin(name: &str) -> PathBuf {
    workspace_root().join("target/debug").join(name)
}

pub fn in_ns(netns: &str, args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", netns]).args(args);
    c
}

/// The iperf3 server the demo's and the soak's traffic goes to, on `host`'s lab address.
pub fn iperf3_server(host: &Host) -> anyhow::Result<Reaped> {
    let child = in_ns(&host.netns, &["iperf3", "-s", "-B", &host.ipv4])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s (is iperf3 installed? cargo xtask setup installs it)")?;
    Ok(Reaped(child, "iperf3 -s"))
}

/// `linkpilot run` (binary `bin`) in `netns` with `policy` and every file it keeps (board, env
/// file, originals, lock, status socket, tuner and job report directories) at `file(name)`;
/// info logging, stdout discarded. Callers add what else they want and where the log goes.
pub fn linkpilot_run(
    bin: &Path,
    netns: &str,
    policy: &Path,
    file: &dyn Fn(&str) -> String,
) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{netns}"))
        .arg(bin)
        .args(["run", "--policy", &policy.display().to_string()])
        .args(["--board", &file("knobs"), "--env-file", &file("nccl.env")])
        .args(["--sysctl-state", &file("sysctl-originals.json"), "--lock", &file("lock")])
        .args(["--roce-tc-state", &file("roce-tc-originals.json")])
        .args(["--status-socket", &file("status.sock"), "--tuner-stats", &file("tuner")])
        .args(["--job-reports", &file("jobs")])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null());
    c
}

/// Seconds in one pass of `scenario` (a built-in name or a file), as the lab computes it.
pub fn pass_seconds(scenario: &str) -> anyhow::Result<f64> {
    Ok(check(scenario)?.0)
}

/// The best rate any of the scenario's phases gives, bit/s (`None`: no phase limits the rate).
pub fn top_rate(scenario: &str) -> anyhow::Result<Option<f64>> {
    Ok(check(scenario)?.1)
}

/// `linkpilot-lab check`: seconds per pass and the top rate.
fn check(scenario: &str) -> anyhow::Result<(f64, Option<f64>)> {
    let out = Command::new(bin("linkpilot-lab"))
        .args(["check", scenario])
        .output()
        .context("running linkpilot-lab check")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("scenario {scenario}: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    // "OK: hk-us-day (N phases, 333.0 s per pass, up to 300000000 bit/s)" or "..., unlimited rate)"
    let mut parts = text.trim().trim_end_matches(')').split(", ");
    let unexpected = || format!("unexpected linkpilot-lab check output: {text}");
    let secs = parts
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok())
        .with_context(unexpected)?;
    let rate = match parts.next().with_context(unexpected)? {
        "unlimited rate" => None,
        r => Some(
            r.strip_prefix("up to ")
                .and_then(|r| r.strip_suffix(" bit/s"))
                .and_then(|r| r.parse::<f64>().ok())
                .with_context(unexpected)?,
        ),
    };
    Ok((secs, rate))
}

/// A running lab: the process, its hosts (HK first, then US, by index) and every JSON line of
/// ground truth it printed (one per direction and second, with `unix_ms`).
pub struct Lab {
    #[expect(dead_code, reason = "held for its Drop, which stops the lab")]
    process: Reaped,
    pub hosts: Vec<Host>,
    pub latest: Arc<Mutex<std::collections::BTreeMap<String, Value>>>,
    pub timeline: Arc<Mutex<Vec<Value>>>,
}

impl Lab {
    pub fn host(&self, site: &str, index: usize) -> &Host {
        self.hosts.iter().filter(|h| h.site == site).nth(index).expect("host within the lab")
    }

    /// Starts `linkpilot-lab run` (the binary `lab_bin`) and returns once every host exists;
    /// its log goes to `out/lab.log`.
    pub fn start(
        lab_bin: &Path,
        out: &Path,
        scenario: &str,
        name: &str,
        hosts_per_site: u8,
        secs: u64,
    ) -> anyhow::Result<Self> {
        let _ =
            Command::new(lab_bin).args(["cleanup", "--name", name]).stdout(Stdio::null()).status();
        let mut child = Command::new(lab_bin)
            .args(["run", "--scenario", scenario, "--name", name, "--json"])
            .args(["--hosts", &hosts_per_site.to_string(), "--duration", &secs.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting linkpilot-lab")?;
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let process = Reaped(child, "linkpilot-lab");
        let hosts = Arc::new(Mutex::new(Vec::new()));
        let log = fs::File::create(out.join("lab.log"))?;
        if let Some(stderr) = stderr {
            let hosts = hosts.clone();
            thread::spawn(move || {
                use std::io::Write as _;
                let mut log = log;
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    // "host Hk netns lpl-demo-hk0 eth0 198.18.1.10 2001:db8:1::10"
                    let f: Vec<&str> = line.split_whitespace().collect();
                    if let ["host", site, "netns", netns, _iface, ipv4, ..] = f.as_slice() {
                        let h = Host {
                            site: (*site).into(),
                            netns: (*netns).into(),
                            ipv4: (*ipv4).into(),
                        };
                        if let Ok(mut v) = hosts.lock() {
                            v.push(h);
                        }
                    }
                    let _ = writeln!(log, "{line}");
                }
            });
        }
        let latest = Arc::new(Mutex::new(std::collections::BTreeMap::new()));
        let timeline = Arc::new(Mutex::new(Vec::new()));
        if let Some(stdout) = stdout {
            let (latest, timeline) = (latest.clone(), timeline.clone());
            thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        let dir = v["direction"].as_str().unwrap_or("?").to_owned();
                        if let Ok(mut m) = latest.lock() {
                            m.insert(dir, v.clone());
                        }
                        if let Ok(mut t) = timeline.lock() {
                            t.push(v);
                        }
                    }
                }
            });
        }
        let want = 2 * usize::from(hosts_per_site);
        let start = Instant::now();
        loop {
            let got = hosts.lock().map(|v| v.clone()).unwrap_or_default();
            if got.len() >= want {
                let mut hosts = got;
                hosts.sort_by_key(|h| (h.site != "Hk", h.netns.clone()));
                return Ok(Self { process, hosts, latest, timeline });
            }
            if start.elapsed() > Duration::from_secs(30) {
                bail!("the lab did not start; see {}", out.join("lab.log").display());
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}
