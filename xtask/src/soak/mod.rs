//! `cargo xtask soak`: the daemon on the WAN lab with real traffic, for longer than a test.
//! Two steps: `kill` (SIGKILL `linkpilot run` every 10-30 s, restart it, and check what it
//! leaves behind) and `day` (a compressed day: an hour at the 10 Hz tick against the looping
//! `hk-us-day`, RSS and CPU sampled every minute). `--quick` is the short form `cargo xtask test`
//! runs; the long forms' figures go to RELIABILITY.md.

mod day;
mod kill;

use std::{
    fs,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::{
    lab::{self, Reaped},
    run::{status, workspace_root},
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Step {
    Kill,
    Day,
}

pub struct Args {
    pub quick: bool,
    pub steps: Vec<Step>,
    pub seed: Option<u64>,
    pub restarts: Option<u32>,
    pub minutes: Option<u64>,
    /// The daemon's release build (what operators run) instead of the debug build.
    pub release: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !lab::is_root() {
        bail!("the soak builds network namespaces and loads eBPF programs: run it as root");
    }
    crate::setup::run()?;
    crate::build_ebpf::debug_binaries()?;
    let daemon = if args.release {
        crate::build_ebpf::release_daemon()?
    } else {
        crate::lab::bin("linkpilot")
    };
    let steps = if args.steps.is_empty() { vec![Step::Kill, Step::Day] } else { args.steps };
    // The short form apart, so that CI or a quick check never clears a long run's results.
    let root = workspace_root().join(if args.quick { "target/soak-quick" } else { "target/soak" });
    for step in steps {
        match step {
            Step::Kill => {
                let seed = args.seed.unwrap_or_else(time_seed);
                let (restarts, gap) = if args.quick { (3, (3, 6)) } else { (10, (10, 30)) };
                let restarts = args.restarts.unwrap_or(restarts);
                // The short form's lab has a name of its own too: starting a lab cleans up one of its name.
                let lab = if args.quick { "klkillq" } else { "klkill" };
                kill::run(&fresh(&root.join("kill"))?, lab, &daemon, seed, restarts, gap)
                    .context("soak kill")?;
            }
            Step::Day => {
                let (minutes, every) = if args.quick { (3, 5) } else { (60, 60) };
                let minutes = args.minutes.unwrap_or(minutes);
                day::run(
                    &fresh(&root.join("day"))?,
                    &daemon,
                    minutes,
                    Duration::from_secs(every),
                    args.quick,
                )
                .context("soak day")?;
            }
        }
    }
    Ok(())
}

fn time_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

fn fresh(dir: &Path) -> anyhow::Result<PathBuf> {
    let _ = fs::remove_dir_all(dir);
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.to_owned())
}

/// `linkpilot run` in `netns` with every path under `dir` (the log appended to
/// `dir/daemon.log`, so restarts keep one log), returned once its status socket answers.
fn start_daemon(
    bin: &Path,
    netns: &str,
    dir: &Path,
    policy: &Path,
    extra: &[String],
) -> anyhow::Result<Reaped> {
    let p = |f: &str| dir.join(f).display().to_string();
    let log = fs::OpenOptions::new().create(true).append(true).open(dir.join("daemon.log"))?;
    let daemon = Reaped(
        crate::lab::linkpilot_run(bin, netns, policy, &p)
            .args(extra)
            .stderr(log)
            .spawn()
            .context("starting linkpilot run")?,
        "linkpilot run",
    );
    Ok(daemon)
}

/// Polls the daemon's status socket until it answers; fails if the daemon exits first or
/// `limit` passes.
fn wait_up(daemon: &mut Reaped, dir: &Path, limit: Duration) -> anyhow::Result<serde_json::Value> {
    let start = Instant::now();
    loop {
        if let Some(s) = crate::demo::query(&dir.join("status.sock")) {
            return Ok(s);
        }
        if let Ok(Some(st)) = daemon.0.try_wait() {
            bail!(
                "the daemon exited ({st}) before it answered; see {}",
                dir.join("daemon.log").display()
            );
        }
        if start.elapsed() > limit {
            bail!(
                "the daemon did not answer within {limit:?}; see {}",
                dir.join("daemon.log").display()
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// iperf3 across the lab, from HK to US, as the demo drives it; stopped when dropped.
struct Traffic {
    server: Option<Reaped>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // The client fails as soon as its server is gone; the thread then sees `stop`.
        drop(self.server.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The iperf3 server on the US host and the client loop from HK until `deadline`, with ECN on
/// in both namespaces as the demo has it, or (`ecn_on_hk` false) only on US, leaving HK's
/// `tcp_ecn` for the policy's `[host]` section to change.
fn traffic(
    running: &lab::Lab,
    dir: &Path,
    deadline: Instant,
    ecn_on_hk: bool,
) -> anyhow::Result<Traffic> {
    let (hk, us) = (running.host("Hk", 0).clone(), running.host("Us", 0).clone());
    for h in [&hk, &us].into_iter().filter(|h| ecn_on_hk || h.site != "Hk") {
        status("enable ECN", &mut lab::in_ns(&h.netns, &["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]))?;
    }
    let server = lab::iperf3_server(&us)?;
    let stop = Arc::new(AtomicBool::new(false));
    let log = dir.join("iperf3.log");
    let t = crate::demo::drive_traffic(hk.netns, us.ipv4, deadline, log, stop.clone());
    Ok(Traffic { server: Some(server), stop, thread: Some(t) })
}
