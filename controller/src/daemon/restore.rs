//! `linkpilot restore`: puts back what a daemon that stopped without rolling back left changed
//! (killed, or given up on by systemd: the unit's `ExecStopPost`): the sysctls and RoCE
//! traffic classes from their crash-state files, and the classifiers a killed run left attached
//! to the policy's interfaces. Refused while a daemon holds the lock; with nothing left behind,
//! it changes nothing.

use std::path::PathBuf;

use tracing::{info, warn};

use crate::{
    actuate::{roce_tc::RoceTc, sysctl::Sysctls},
    kernel::probes,
};

/// `linkpilot restore`'s options: the same files as `linkpilot run`'s, with its defaults.
#[derive(Clone, Debug, clap::Args)]
pub struct RestoreOptions {
    /// The policy whose interfaces are cleared of a killed run's classifiers; one that cannot
    /// be read or parsed is said and skipped (the sysctls and classes are restored anyway).
    #[arg(long, default_value = crate::control::policy::DEFAULT_PATH)]
    pub policy: PathBuf,
    #[arg(long, default_value = crate::actuate::sysctl::PROC_SYS)]
    pub sysctl_root: PathBuf,
    #[arg(long, default_value = crate::actuate::sysctl::DEFAULT_STATE)]
    pub sysctl_state: PathBuf,
    #[arg(long, default_value = crate::actuate::roce_tc::CONFIGFS_ROOT)]
    pub rdma_cm_root: PathBuf,
    #[arg(long, default_value = crate::actuate::roce_tc::DEFAULT_STATE)]
    pub roce_tc_state: PathBuf,
    #[arg(long, default_value = super::DEFAULT_LOCK)]
    pub lock: PathBuf,
}

pub fn run(o: &RestoreOptions) -> anyhow::Result<()> {
    // A running daemon owns all of it: restoring under it would undo its work.
    let _lock = super::lock(&o.lock)?;
    let sysctls_left = o.sysctl_state.exists();
    // Opening restores what a state file holds, and removes the file.
    Sysctls::open(&o.sysctl_root, &o.sysctl_state)?;
    let classes_left = o.roce_tc_state.exists();
    RoceTc::open(&o.rdma_cm_root, &o.roce_tc_state)?;
    let mut removed = 0;
    match std::fs::read(&o.policy)
        .map_err(anyhow::Error::from)
        .and_then(|b| super::load_policy(&o.policy, &b))
    {
        Ok(policy) => {
            for iface in super::interfaces(&policy) {
                let (gone, foreign) = probes::remove_stale(&iface);
                for r in &gone {
                    info!("removed a stale attachment of a killed run: {r}");
                }
                for f in foreign {
                    warn!(
                        "{f} is attached and held by something else (a pinned link?); left alone"
                    );
                }
                removed += gone.len();
            }
        }
        Err(e) => warn!(
            "{}: {e:#}; a killed run's classifiers, if any, stay until the next start",
            o.policy.display()
        ),
    }
    if !sysctls_left && !classes_left && removed == 0 {
        info!("nothing left changed: nothing to restore");
    }
    Ok(())
}
