//! The `linkpilot` command line.

use std::{process::ExitCode, time::Duration};

use clap::{Parser, Subcommand};
use ipnet::IpNet;
use linkpilot::cli::watch::{self, parse_dscp, parse_peer, DscpArg};
use tracing::error;

#[derive(Parser)]
#[command(name = "linkpilot", version, about = "eBPF-based adaptive link controller")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The node daemon: watch the policy's links, decide, and apply the knobs every tick.
    Run(Box<linkpilot::daemon::RunOptions>),
    /// Put back what a daemon that stopped without rolling back left changed (killed, or
    /// given up on): sysctls and RoCE classes from their crash-state files, and a killed run's
    /// classifiers on the policy's interfaces. The systemd unit's ExecStopPost. Refused while a
    /// daemon runs.
    Restore(linkpilot::daemon::RestoreOptions),
    /// Ask the running daemon for its links' states, knobs and signals (root only).
    Status {
        /// The daemon's status socket.
        #[arg(long, default_value = linkpilot::daemon::status::DEFAULT_SOCKET)]
        socket: std::path::PathBuf,
        /// The raw JSON reply.
        #[arg(long)]
        json: bool,
    },
    /// Print the NCCL env file the daemon keeps (init-time NCCL and launcher settings), or with
    /// --policy, what a policy starts with before any measurement.
    Env {
        /// The env file to print.
        #[arg(long, default_value = linkpilot::actuate::envfile::DEFAULT_PATH, conflicts_with = "policy")]
        file: std::path::PathBuf,
        /// Print the starting values of this policy's first link instead.
        #[arg(long)]
        policy: Option<std::path::PathBuf>,
        /// With --policy: the NCCL tuner plugin, named (NCCL_TUNER_PLUGIN, with NCCL_BUFFSIZE
        /// the policy's largest chunk) if installed there; "off": never.
        #[arg(long, default_value = linkpilot::actuate::envfile::DEFAULT_TUNER, requires = "policy")]
        nccl_tuner: std::path::PathBuf,
    },
    /// The knob board without a daemon: `linkpilot board feed --board PATH`.
    Board {
        #[command(subcommand)]
        action: BoardAction,
    },
    /// Policy files: `linkpilot policy check FILE...`.
    Policy {
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Run a trace of snapshots (JSON lines) through the control core and print the decisions.
    Replay {
        /// The trace: one sensors snapshot per line (`watch --snapshots`, the daemon's --record).
        trace: std::path::PathBuf,
        /// The policy file.
        #[arg(long, default_value = linkpilot::control::policy::DEFAULT_PATH)]
        policy: std::path::PathBuf,
        /// Draw signals, states and knobs over time into this SVG file.
        #[arg(long, value_name = "SVG")]
        plot: Option<std::path::PathBuf>,
        /// One JSON decision per line instead of the timeline.
        #[arg(long, conflicts_with = "plans")]
        json: bool,
        /// Instead of the decisions, the plan after every snapshot (JSON lines): each link's
        /// state, knobs, NCCL rule and rates, as the daemon applies them and `status --json`
        /// shows the one in place.
        #[arg(long)]
        plans: bool,
    },
    /// List RDMA devices: what libibverbs can open, and every port in sysfs with its state,
    /// netdevs and congestion counters.
    Rdma {
        /// The sysfs directory of RDMA devices.
        #[arg(long, default_value = linkpilot::rdma::SYSFS_ROOT)]
        root: std::path::PathBuf,
        /// JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Nanoseconds per packet of each TC program via BPF_PROG_TEST_RUN, next to an empty one.
    BenchPrograms {
        /// Runs per measurement (the kernel reports the mean).
        #[arg(long, default_value_t = 1_000_000)]
        repeat: u32,
        /// Measurements per cell; the median is printed.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
    },
    /// What a sensors tick costs with a full flow table (synthetic flows in the real kernel
    /// map), and the sensors' memory once their RTT windows are full.
    BenchSensors {
        #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=linkpilot_common::MAX_FLOWS as i64))]
        flows: u32,
        #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=linkpilot_common::MAX_PEERS as i64))]
        peers: u32,
        /// Ticks at 10 Hz of virtual time (100 fill the 10 s RTT windows).
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u32).range(1..))]
        ticks: u32,
    },
    /// What one tick of the control core costs for many links and peers.
    BenchControl {
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=1024))]
        links: u32,
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        peers: u32,
        #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        ticks: u64,
    },
    /// Count packets, bytes and TCP retransmissions per interface, printed once a second.
    Watch {
        /// Interface to watch (repeat for several).
        #[arg(long = "iface", required = true, value_name = "IF")]
        ifaces: Vec<String>,
        /// One JSON object per interface and second instead of a table.
        #[arg(long)]
        json: bool,
        /// With --json: list each interface's TCP flows (RTT, retransmissions).
        #[arg(long, requires = "json")]
        flows: bool,
        /// Print one sensors snapshot per second (JSON: rates, CE fraction, retransmissions,
        /// RTT srtt/min/p50/p99 over a 10 s window, CNPs, per link and peer) instead.
        #[arg(long, conflicts_with_all = ["json", "flows"])]
        snapshots: bool,
        /// A named peer: NAME=CIDR (repeat; several CIDRs may share a name). Traffic to or from
        /// no named peer is counted as "other".
        #[arg(long = "peer", value_name = "NAME=CIDR", value_parser = parse_peer)]
        peers: Vec<(String, IpNet)>,
        /// Rewrite the DSCP of egress packets: SELECTOR=DSCP, where SELECTOR is a peer name or
        /// `*`, optionally followed by `:LO-HI` (source or destination port range), and
        /// optionally preceded by `IF/` (only on that watched interface; without it, on every
        /// one). First match wins; ECN bits are kept. E.g. `--dscp us=26`,
        /// `--dscp '*:5201-5210=46'`, `--dscp eth1/us=10`.
        #[arg(long = "dscp", value_name = "SELECTOR=DSCP", value_parser = parse_dscp)]
        dscp: Vec<DscpArg>,
        /// With --snapshots: the sysfs directory of RDMA devices whose congestion counters join
        /// the snapshot of the link that is their netdev.
        #[arg(long, default_value = linkpilot::rdma::SYSFS_ROOT, value_name = "DIR")]
        rdma_root: std::path::PathBuf,
        /// Stop after this many one-second intervals (default: until Ctrl-C or SIGTERM).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
}

#[derive(Subcommand)]
enum BoardAction {
    /// Write a knob board from JSON lines on stdin, to test training code against chosen knobs
    /// without a daemon (the Python package's tests get their boards this way, written by the
    /// daemon's own writer).
    ///
    /// Each line publishes `{"links":[{"name":"wan","state":"congested","state_index":1,
    /// "compression":"int8","chunk_bytes":8388608,"watchdog_s":600,"decision_id":7}]}`. Every
    /// field of docs/knob-board.md may be given (also tcp_buffer_bytes, nccl_ib_timeout,
    /// nccl_ib_retry_cnt, dscp, roce_traffic_class, topk_ratio, and for the NCCL tuner plugin
    /// nccl_algo, nccl_proto, nccl_max_channels, nccl_min_bytes, rtt_us); omitted ones take the
    /// reference case's starting values (healthy, index 0, none, 8 MiB chunks, 128 MiB
    /// buffers, watchdog 600 s, IB timeout 22, retry 7, DSCP 26, TC 106, NCCL tree/simple from
    /// 1 MiB with NCCL's channels, RTT 0: not measured), and decision_id the line number.
    /// NCCL algorithms: auto, tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat;
    /// protocols: auto, ll, ll128, simple. Compression: none, fp16, bf16, int8, int4, topk:0.01 (or topk:1%, or topk
    /// with topk_ratio). After each publish `published ID` (the line's highest decision id) is
    /// printed on stdout. Blank lines are skipped. A bad line stops the feed with exit code 1
    /// and an error naming the line; nothing of it is published. At end of input the command
    /// exits 0 and leaves the board as it is: it goes stale like a dead daemon's.
    #[command(verbatim_doc_comment)]
    Feed {
        /// The board file to create (replaced if it exists; not the daemon's while it runs).
        #[arg(long)]
        board: std::path::PathBuf,
        /// How often to beat; readers call the board stale after two missed beats.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
        heartbeat_ms: u64,
    },
}

#[derive(Subcommand)]
enum PolicyAction {
    /// Check policy files: prints OK or every error with file, line and column; exit code 1 if
    /// any file has errors.
    Check {
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Print a commented starting policy for one link, sized from its capacity and RTT:
    /// `linkpilot policy init --interface eth2 --peer us=10.2.0.0/16 --capacity 40Gbit/s
    /// --rtt 180ms > policy.toml`.
    Init(linkpilot::cli::policy_init::InitArgs),
}

fn main() -> ExitCode {
    // Exit quietly when stdout is a closed pipe (`linkpilot rdma | head`), as Unix tools do,
    // instead of panicking on the failed write. Programs and links are fd-owned: exit detaches.
    // SAFETY: restoring the default disposition of one signal before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            error!("starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Rdma { root, json } => linkpilot::rdma::print(&root, json),
        Command::Env { file, policy, nccl_tuner } => {
            linkpilot::actuate::envfile::print(&file, policy.as_deref(), &nccl_tuner)
        }
        Command::Run(options) => runtime.block_on(linkpilot::daemon::run(*options)),
        Command::Restore(options) => linkpilot::daemon::restore::run(&options),
        Command::Status { socket, json } => {
            linkpilot::daemon::status::query(&socket).and_then(|s| {
                if json {
                    println!("{}", serde_json::to_string_pretty(&s)?);
                } else {
                    print!("{}", linkpilot::daemon::status::render(&s));
                }
                Ok(())
            })
        }
        Command::Board { action: BoardAction::Feed { board, heartbeat_ms } } => {
            linkpilot::board::feed::run(
                &board,
                Duration::from_millis(heartbeat_ms),
                std::io::BufReader::new(std::io::stdin()),
                &mut std::io::stdout(),
            )
        }
        Command::Policy { action: PolicyAction::Check { files } } => {
            let all_ok = linkpilot::cli::policy_check::check_files(&files);
            return if all_ok { ExitCode::SUCCESS } else { ExitCode::from(1) };
        }
        Command::Policy { action: PolicyAction::Init(args) } => {
            return linkpilot::cli::policy_init::run(args);
        }
        Command::Replay { trace, policy, plot, json, plans } => {
            use linkpilot::cli::replay::{run_file, Output};
            let output = match (json, plans) {
                (_, true) => Output::Plans,
                (true, false) => Output::Json,
                (false, false) => Output::Timeline,
            };
            run_file(&trace, &policy, plot.as_deref(), output)
        }
        Command::BenchPrograms { repeat, rounds } => {
            linkpilot::bench::programs::run(repeat, rounds.max(1))
        }
        Command::BenchControl { links, peers, ticks } => {
            linkpilot::bench::core::run(links as usize, peers as usize, ticks)
        }
        Command::BenchSensors { flows, peers, ticks } => {
            linkpilot::bench::sensors::run(flows, peers, ticks)
        }
        Command::Watch { ifaces, json, flows, snapshots, peers, dscp, rdma_root, count } => {
            let output = if snapshots {
                watch::run::Output::Snapshots
            } else if json {
                watch::run::Output::Json { flows }
            } else {
                watch::run::Output::Table
            };
            runtime.block_on(watch::run::run(&ifaces, output, &peers, &dscp, &rdma_root, count))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
