//! `linkpilot policy check`: each file checked as `linkpilot run` would, and what this host
//! lacks for it (interfaces, congestion controls) said as warnings.

use crate::control::Policy;

/// `linkpilot policy check`: prints OK or the errors of each file; whether all were OK.
pub fn check_files(files: &[std::path::PathBuf]) -> bool {
    let mut ok = true;
    for f in files {
        match Policy::load_with_digest(f) {
            Ok((policy, sha256)) => {
                println!("{}: OK (sha256 {sha256})", f.display());
                for w in
                    missing_interfaces(&policy).into_iter().chain(policy.lossless_queue_warnings())
                {
                    eprintln!("{}: warning: {w}", f.display());
                }
                // Like the interfaces, a warning here (`linkpilot run` refuses them).
                let proc_sys = std::path::Path::new("/proc/sys");
                if let Ok(available) = crate::kernel::checks::congestion_controls(proc_sys) {
                    if let Err(errors) = policy.check_algorithms(&available) {
                        for e in errors.0 {
                            eprintln!("warning: {e}");
                        }
                    }
                }
            }
            Err(e) => {
                ok = false;
                println!("{e}");
            }
        }
    }
    ok
}

/// Interfaces the policy names that this host lacks: a warning, not an error, since a policy
/// is often checked away from the nodes it is for (`linkpilot run` refuses to start without
/// them).
fn missing_interfaces(p: &Policy) -> Vec<String> {
    let net = std::path::Path::new("/sys/class/net");
    p.links
        .iter()
        .flat_map(|l| l.interfaces.iter().map(move |i| (l, i)))
        .filter(|(_, i)| *i != crate::kernel::iface::DEFAULT_ROUTE && !net.join(i).exists())
        .map(|(l, i)| {
            format!(
                "link {:?}: no interface {i} on this host (`linkpilot run` needs it where it runs)",
                l.name
            )
        })
        .collect()
}
