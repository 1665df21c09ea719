//! Watched interfaces that go away and come back. A deleted device takes our classifiers with
//! it; one created again under the same name is a new device (a new ifindex) with nothing
//! attached. Checked with the address sync, once a second: a missing interface is said once
//! (log, status `interfaces_missing`, `linkpilot_interface_present` 0) and its link reads no
//! traffic, which is the truth, while the daemon keeps deciding; one that is back is watched
//! again (old links detached, fresh counters, DSCP rules rewritten for its new index). A device
//! that cannot be watched again (say, a link type we do not parse) fails the tick, and a
//! lasting failure stops the daemon with that reason (health.rs).

use anyhow::Context;
use tracing::{info, warn};

use super::{metrics::Metrics, sensing::Sensing};
use crate::kernel::iface::{Iface, IfaceError};

/// What changed for one watched interface since the last check.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    Same,
    Gone,
    /// The name now belongs to another device (or the same one with another link type).
    Recreated(Iface),
}

/// Compares the interface as the daemon watches it with what the name resolves to now.
pub fn compare(watched: &Iface, now: Result<Iface, IfaceError>) -> anyhow::Result<Change> {
    match now {
        Ok(i) if i.ifindex == watched.ifindex && i.l2 == watched.l2 => Ok(Change::Same),
        Ok(i) => Ok(Change::Recreated(i)),
        Err(IfaceError::NotFound { .. }) => Ok(Change::Gone),
        Err(e) => Err(e).with_context(|| format!("watching {} again", watched.name)),
    }
}

impl Sensing {
    /// Follows the watched interfaces' deletion and re-creation (see the module comment); those
    /// created again and attached are kept for the actuators (`take_recreated`).
    pub(super) fn follow_interfaces(&mut self, metrics: &Metrics) -> anyhow::Result<()> {
        for at in 0..self.ifaces.len() {
            let old = self.ifaces[at].clone();
            let name = old.name.clone();
            match compare(&old, Iface::resolve(&name))? {
                Change::Same => {
                    if self.missing.contains(&name) {
                        info!("{name} is back with its old index; still attached");
                        self.missing.retain(|m| *m != name);
                    }
                }
                Change::Gone => {
                    if !self.missing.contains(&name) {
                        warn!(
                            "{name} is gone: its link reads no traffic until an interface of \
                             that name appears, which is then watched again (checked every \
                             second)"
                        );
                        self.missing.push(name.clone());
                    }
                }
                Change::Recreated(new) => {
                    self.probes.rewatch(&old, &new).with_context(|| {
                        format!("watching {name} again (ifindex {})", new.ifindex)
                    })?;
                    info!(
                        "{name} was created again (ifindex {} -> {}): attached to it",
                        old.ifindex, new.ifindex
                    );
                    self.ifaces[at] = new.clone();
                    // The DSCP rules name the interface by index: the actuators rewrite them.
                    self.recreated.push(new);
                    self.missing.retain(|m| *m != name);
                    Metrics::count(&metrics.interface_reattached, "interface", &name);
                }
            }
            let present = i64::from(!self.missing.contains(&name));
            metrics.interface_present(&name, present);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(ifindex: u32, l2: u32) -> Iface {
        Iface { name: "eth0".into(), ifindex, l2 }
    }

    #[test]
    fn a_new_index_or_link_type_is_a_new_device_and_absence_is_not_an_error() {
        let w = iface(4, 0);
        assert_eq!(compare(&w, Ok(iface(4, 0))).unwrap(), Change::Same);
        assert_eq!(compare(&w, Ok(iface(9, 0))).unwrap(), Change::Recreated(iface(9, 0)));
        assert_eq!(compare(&w, Ok(iface(4, 1))).unwrap(), Change::Recreated(iface(4, 1)));
        let gone = Err(IfaceError::NotFound { name: "eth0".into() });
        assert_eq!(compare(&w, gone).unwrap(), Change::Gone);
        let odd = Err(IfaceError::UnsupportedLinkType { name: "eth0".into(), arphrd: 24 });
        let e = format!("{:#}", compare(&w, odd).unwrap_err());
        assert!(e.contains("watching eth0 again") && e.contains("link type 24"), "{e}");
    }
}
