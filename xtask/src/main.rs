//! Project automation: `cargo xtask setup | build-ebpf | test`.

mod build_ebpf;
mod run;
mod setup;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "linkpilot project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what a fresh machine lacks (idempotent; seconds when everything is present).
    Setup,
    /// Build the eBPF object (through the controller's build script) and print its path.
    BuildEbpf {
        /// Build the release profile of the controller.
        #[arg(long)]
        release: bool,
    },
    /// Setup, then fmt check, clippy, unit tests and (as root) the privileged tests.
    Test {
        /// Skip the privileged tests (they need root: namespaces, eBPF).
        #[arg(long)]
        no_privileged: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Setup => setup::run(),
        Command::BuildEbpf { release } => {
            let path = build_ebpf::build(release)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Test { no_privileged } => test::run(!no_privileged),
    }
}
