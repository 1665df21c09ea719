//! Attaching: the classifiers on each watched interface (TCX, or netlink clsact filters on
//! kernels before 6.6), moving them to a re-created device, the TCP tracepoints, and removing
//! what a killed run left behind. Apart from loading, since it is what changes the host.

use aya::{
    programs::{
        tc::{self, NlOptions, TcAttachOptions},
        RawTracePoint, SchedClassifier, TcAttachType, TracePoint,
    },
    util::KernelVersion,
};
use linkpilot_common::{
    PROG_SOCK_STATE, PROG_TCP_PROBE, PROG_TCP_RETRANSMIT, PROG_TCP_RETRANSMIT_RECORD,
    PROG_TC_EGRESS, PROG_TC_INGRESS,
};
use tracing::{debug, info};

use super::{program, ProbeError, Probes};
use crate::kernel::iface::Iface;

/// The classifiers, by hook: (program, attach type, direction as logged).
const CLASSIFIERS: [(&str, TcAttachType, &str); 2] = [
    (PROG_TC_INGRESS, TcAttachType::Ingress, "ingress"),
    (PROG_TC_EGRESS, TcAttachType::Egress, "egress"),
];

impl Probes {
    /// Starts counting on `iface`: zeroes its counters, then attaches ingress and egress.
    pub fn watch(&mut self, iface: &Iface) -> Result<(), ProbeError> {
        self.count_on(iface)?;
        self.attach_tc(iface)
    }

    /// Attaches through the clsact qdisc (netlink) even where TCX exists: what kernels before
    /// 6.6 get. Such filters outlive a killed process; [`remove_stale`] finds them.
    pub fn use_netlink_tc(&mut self) {
        self.netlink_tc = true;
    }

    fn attach_tc(&mut self, iface: &Iface) -> Result<(), ProbeError> {
        let netlink = self.netlink_tc
            || KernelVersion::current().is_ok_and(|v| v < KernelVersion::new(6, 6, 0));
        if netlink {
            // Classifiers hang off the clsact qdisc; it may already exist.
            let _ = tc::qdisc_add_clsact(&iface.name);
        }
        let mut links = Vec::new();
        for (name, attach_type, direction) in CLASSIFIERS {
            let prog: &mut SchedClassifier = program(&mut self.ebpf, name)?;
            let attached = if netlink {
                prog.attach_with_options(
                    &iface.name,
                    attach_type,
                    TcAttachOptions::Netlink(NlOptions::default()),
                )
            } else {
                prog.attach(&iface.name, attach_type)
            };
            let link = attached.map_err(|e| ProbeError::Attach {
                program: name,
                iface: iface.name.clone(),
                direction,
                source: Box::new(e),
            })?;
            links.push((name, link));
            debug!(iface = %iface.name, ifindex = iface.ifindex, direction, "attached");
        }
        self.tc_links.push((iface.ifindex, links));
        self.watched.push(iface.clone());
        Ok(())
    }

    /// `old` was deleted and `new` carries its name now: detaches the links that went with the
    /// old device (defunct, but held until detached: bpftool would show them beside the new
    /// ones), drops its counters and watches `new`.
    pub fn rewatch(&mut self, old: &Iface, new: &Iface) -> Result<(), ProbeError> {
        if let Some(at) = self.tc_links.iter().position(|(i, _)| *i == old.ifindex) {
            let (_, links) = self.tc_links.remove(at);
            for (name, link) in links {
                // A link of a deleted device: detaching only closes it; nothing to report.
                if let Ok(prog) = program::<SchedClassifier>(&mut self.ebpf, name) {
                    let _ = prog.detach(link);
                }
            }
        }
        // An absent entry is fine: the configuration of an index nothing carries any more. Its
        // slot is free again (zeroed when next given out).
        let _ = self.config.remove(&old.ifindex);
        for c in self.counted.iter_mut().filter(|c| c.is_some_and(|c| c.ifindex == old.ifindex)) {
            *c = None;
        }
        self.refresh_index(old.ifindex)?;
        self.watched.retain(|w| w.ifindex != old.ifindex);
        self.watch(new)
    }

    /// Attaches the TCP tracepoints: retransmissions (raw, or the record's fallback), RTT
    /// (`tcp:tcp_probe`) and connection state (`sock:inet_sock_set_state`).
    pub fn attach_tracepoints(&mut self) -> Result<(), ProbeError> {
        let attaching = |program| {
            move |e| ProbeError::Program { action: "attaching", program, source: Box::new(e) }
        };
        if self.raw_retransmit {
            let prog: &mut RawTracePoint = program(&mut self.ebpf, PROG_TCP_RETRANSMIT)?;
            prog.attach("tcp_retransmit_skb").map_err(attaching(PROG_TCP_RETRANSMIT))?;
            info!("attached tcp_retransmit_skb (raw tracepoint)");
        }
        let record = (!self.raw_retransmit).then_some((
            PROG_TCP_RETRANSMIT_RECORD,
            "tcp",
            "tcp_retransmit_skb",
        ));
        for (name, category, event) in record.into_iter().chain([
            (PROG_TCP_PROBE, "tcp", "tcp_probe"),
            (PROG_SOCK_STATE, "sock", "inet_sock_set_state"),
        ]) {
            let prog: &mut TracePoint = program(&mut self.ebpf, name)?;
            prog.attach(category, event).map_err(attaching(name))?;
            info!("attached {category}:{event}");
        }
        Ok(())
    }
}

/// Removes our classifiers that a killed run left on `iface`'s clsact qdisc (netlink filters
/// outlive their process; TCX links do not), identified by program name, never anything else.
/// Returns what was removed. Also reports TCX attachments of ours that some other holder keeps
/// alive (a pinned link): those are not ours to remove.
pub fn remove_stale(iface: &str) -> (Vec<String>, Vec<String>) {
    let mut removed = Vec::new();
    let mut foreign = Vec::new();
    for (name, attach_type, direction) in CLASSIFIERS {
        // Each call removes every filter of that name; "not found" means there was none.
        if tc::qdisc_detach_program(iface, attach_type, name).is_ok() {
            removed.push(format!("{iface} {direction} clsact filter {name}"));
        }
        if let Ok((_, progs)) = SchedClassifier::query_tcx(iface, attach_type) {
            for p in progs {
                if p.name_as_str() == Some(name) {
                    foreign.push(format!("{iface} {direction} TCX program {name} id {}", p.id()));
                }
            }
        }
    }
    (removed, foreign)
}
