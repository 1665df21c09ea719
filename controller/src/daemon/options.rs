//! `linkpilot run`'s options: where everything goes, the defaults being the production paths.

use std::{net::SocketAddr, path::PathBuf};

use super::{health, metrics, status};
use crate::actuate::envfile;

/// Where everything goes; the defaults are the production paths. Also `linkpilot run`'s
/// command line.
#[derive(Clone, Debug, clap::Args)]
pub struct RunOptions {
    /// The policy file.
    #[arg(long, default_value = crate::control::policy::DEFAULT_PATH)]
    pub policy: PathBuf,
    /// Compute and log every decision; change nothing. Also from the environment
    /// (`LINKPILOT_DRY_RUN=true`): the DaemonSets start every site observing, and one
    /// `kubectl set env` switches a site to acting (docs/deploy.md).
    #[arg(long, env = "LINKPILOT_DRY_RUN")]
    pub dry_run: bool,
    #[arg(long, default_value = crate::board::DEFAULT_PATH)]
    pub board: PathBuf,
    #[arg(long, default_value = envfile::DEFAULT_PATH)]
    pub env_file: PathBuf,
    /// The NCCL tuner plugin: while it is installed there, the env file names it
    /// (NCCL_TUNER_PLUGIN) and sets NCCL_BUFFSIZE to the policy's largest chunk; "off": never.
    #[arg(long, default_value = envfile::DEFAULT_TUNER)]
    pub nccl_tuner: PathBuf,
    /// Where training processes' tuner plugins keep their counters (created world-writable
    /// and sticky); status and metrics show them.
    #[arg(long, default_value = crate::board::tuner_stats::DEFAULT_DIR)]
    pub tuner_stats: PathBuf,
    /// Where training processes publish what the network costs their steps (created
    /// world-writable and sticky); status and metrics show it per job.
    #[arg(long, default_value = crate::board::job_reports::DEFAULT_DIR)]
    pub job_reports: PathBuf,
    /// Where the sysctls are read and written: the host's /proc/sys, or the place it is mounted
    /// in a container (whose own /proc/sys is read-only).
    #[arg(long, default_value = crate::actuate::sysctl::PROC_SYS)]
    pub sysctl_root: PathBuf,
    #[arg(long, default_value = crate::actuate::sysctl::DEFAULT_STATE)]
    pub sysctl_state: PathBuf,
    /// Append every decision as a JSON line here.
    #[arg(long, value_name = "FILE")]
    pub decision_log: Option<PathBuf>,
    /// Append every snapshot as a JSON line here (the format `replay` reads).
    #[arg(long, value_name = "FILE")]
    pub record: Option<PathBuf>,
    /// Stop after this many ticks (tests, demos).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub ticks: Option<u64>,
    /// Prometheus metrics (HTTP, /metrics); "off" serves none.
    #[arg(long, default_value = metrics::DEFAULT_ADDR, value_parser = parse_metrics_addr)]
    pub metrics_addr: MetricsAddr,
    /// The status API's Unix socket (root-only).
    #[arg(long, default_value = status::DEFAULT_SOCKET)]
    pub status_socket: PathBuf,
    /// One daemon per host: held locked while running.
    #[arg(long, default_value = super::DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// RDMA devices' sysfs (their ports' netdevs and congestion counters).
    #[arg(long, default_value = crate::rdma::SYSFS_ROOT)]
    pub rdma_root: PathBuf,
    /// rdma_cm's configfs, where the ports' default RoCE traffic class is set.
    #[arg(long, default_value = crate::actuate::roce_tc::CONFIGFS_ROOT)]
    pub rdma_cm_root: PathBuf,
    /// Where the RoCE traffic classes' originals are kept while linkpilot manages them.
    #[arg(long, default_value = crate::actuate::roce_tc::DEFAULT_STATE)]
    pub roce_tc_state: PathBuf,
    /// The cgroup v2 directory whose TCP connections the sock_ops program may tune (those to
    /// the policy's peers, when a state has a `[state.transport]`); default: the unified
    /// hierarchy's root, `/sys/fs/cgroup` (or `/sys/fs/cgroup/unified` on hybrid hosts).
    #[arg(long, value_name = "DIR")]
    pub cgroup: Option<PathBuf>,
    /// Attach classifiers through the clsact qdisc (netlink) even where TCX exists, as on
    /// kernels before 6.6.
    #[arg(long, hide = true)]
    pub netlink_tc: bool,
    /// Stop once sensing has failed on every tick for this long (and at least 10 ticks).
    #[arg(long, value_name = "SECONDS", default_value_t = health::GIVE_UP_AFTER.as_secs(), hide = true)]
    pub sensing_give_up_s: u64,
    /// Skip the capability check and let the kernel refuse what it refuses: shows what each
    /// capability is needed for (a kernel that asks for others would be refused up front).
    #[arg(long, hide = true)]
    pub skip_capability_check: bool,
}

#[derive(Clone, Copy, Debug)]
pub enum MetricsAddr {
    Off,
    At(SocketAddr),
}

impl MetricsAddr {
    /// What to warn about before serving: an unspecified address (0.0.0.0, [::]) serves the
    /// metrics (links, peers, states, decisions) on every interface, to anyone who can reach
    /// the host.
    pub fn exposure_warning(&self) -> Option<String> {
        match self {
            Self::At(a) if a.ip().is_unspecified() => Some(format!(
                "metrics on {a}: every interface of this host serves them, to anyone who can \
                 reach it; give the address of the scraping network (or 127.0.0.1, the default, \
                 behind a local agent) unless a firewall keeps others out"
            )),
            _ => None,
        }
    }
}

fn parse_metrics_addr(s: &str) -> Result<MetricsAddr, String> {
    if s == "off" {
        return Ok(MetricsAddr::Off);
    }
    s.parse().map(MetricsAddr::At).map_err(|_| {
        format!("{s:?} is not an address: expected IP:PORT (e.g. 127.0.0.1:9464) or \"off\"")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unspecified_metrics_address_is_warned_about() {
        let warned = |s: &str| parse_metrics_addr(s).unwrap().exposure_warning();
        for s in ["0.0.0.0:9464", "[::]:9464"] {
            let w = warned(s).expect(s);
            assert!(w.starts_with(&format!("metrics on {s}: every interface")), "{w}");
        }
        for s in ["127.0.0.1:9464", "[::1]:9464", "198.18.0.1:9464", "off"] {
            assert_eq!(warned(s), None, "{s}");
        }
        assert_eq!(metrics::DEFAULT_ADDR, "127.0.0.1:9464", "loopback unless told otherwise");
    }
}
