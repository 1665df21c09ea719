//! `linkpilot policy init`: the flags of a starting policy for one link, and its printing. The
//! policy itself is written by the pure `control::policy::init`.

use std::process::ExitCode;

use linkpilot_common::units::{BitRate, Nanos};

use crate::control::policy::init::{parse_peer, render, InitAnswers};

/// What `policy init` asks of the link.
#[derive(clap::Args)]
pub struct InitArgs {
    /// The link's name.
    #[arg(long, default_value = "wan")]
    link: String,
    /// The interface the link leaves by ("@default-route": the default route's).
    #[arg(long)]
    interface: String,
    /// The far side: NAME=CIDR[,CIDR...] (repeat for several); none: every destination on
    /// the interface counts.
    #[arg(long = "peer", value_parser = parse_peer)]
    peers: Vec<(String, Vec<String>)>,
    /// The link's nominal rate, e.g. 40Gbit/s.
    #[arg(long)]
    capacity: BitRate,
    /// Its round-trip time when idle, e.g. 180ms.
    #[arg(long)]
    rtt: Nanos,
    /// Mark the link's TCP packets to its peers with this DSCP (default: "keep", never
    /// rewritten). Not the RoCE class's DSCP: `policy check` warns where they share a queue.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=63))]
    dscp: Option<u8>,
    /// NCCL_IB_TC and the RoCE ports' class, e.g. 106 (default: "keep").
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=255))]
    roce_traffic_class: Option<u8>,
    /// Leave connections to the peers on the host's congestion control (no BBR profile).
    #[arg(long)]
    no_transport: bool,
    /// The host's socket buffer maxima: "keep" (as the hosts have them) or "auto" (sized
    /// by linkpilot from the delivered rate and the RTT).
    #[arg(long, default_value = "keep", value_parser = ["keep", "auto"])]
    tcp_buffers: String,
}

/// Prints the policy; exit code 1 with the reason where the answers cannot make one.
pub fn run(args: InitArgs) -> ExitCode {
    let answers = InitAnswers {
        link: args.link,
        interface: args.interface,
        peers: args.peers,
        capacity: args.capacity,
        rtt: args.rtt,
        dscp: args.dscp,
        roce_traffic_class: args.roce_traffic_class,
        transport: !args.no_transport,
        tcp_buffers: args.tcp_buffers == "auto",
    };
    match render(&answers) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
