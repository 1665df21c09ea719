//! Network namespaces and veth pairs owned by one test.

use std::{
    fs::File,
    sync::atomic::{AtomicU32, Ordering},
    thread,
};

use nix::sched::{setns, CloneFlags};

use crate::{run, sh};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace deleted when dropped, also when the test panics.
#[derive(Debug)]
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `lpt<pid>-<n>-<role>` with loopback up and IPv6 off, so that the only traffic in
    /// it is what the test sends (no router solicitations or MLD reports).
    pub fn new(role: &str) -> Self {
        let name =
            format!("lpt{}-{}-{role}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        sh(&["ip", "netns", "add", &name]);
        let ns = Self { name };
        ns.exec(&["ip", "link", "set", "lo", "up"]);
        for key in ["all", "default"] {
            ns.exec(&["sysctl", "-qw", &format!("net.ipv6.conf.{key}.disable_ipv6=1")]);
        }
        ns
    }

    /// Runs `args` inside the namespace; panics on failure.
    pub fn exec(&self, args: &[&str]) -> String {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        sh(&full)
    }

    /// Runs `f` on a thread that has entered this namespace; sockets it creates live there.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        thread::spawn(move || {
            let fd = File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
            setns(fd, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
            f()
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace also deletes the veth ends inside it.
        let out = run(&["ip", "netns", "del", &self.name]);
        if !out.status.success() {
            eprintln!("warning: could not delete netns {}: {:?}", self.name, out);
        }
    }
}

/// Two namespaces joined by a veth pair with fixed MACs, static neighbours (no ARP) and IPv4
/// addresses `a_addr` and `b_addr` in one /24.
#[derive(Debug)]
pub struct Pair {
    pub a: Netns,
    pub b: Netns,
    pub a_if: &'static str,
    pub b_if: &'static str,
    pub a_addr: &'static str,
    pub b_addr: &'static str,
}

impl Pair {
    pub fn new(a_addr: &'static str, b_addr: &'static str) -> Self {
        let (a, b) = (Netns::new("a"), Netns::new("b"));
        let pair = Self { a, b, a_if: "lpa0", b_if: "lpb0", a_addr, b_addr };
        pair.connect();
        pair
    }

    const A_MAC: &'static str = "02:00:c6:12:00:01";
    const B_MAC: &'static str = "02:00:c6:12:00:02";

    /// Creates the veth pair with its addresses and neighbours: at the start, and again after a
    /// test deleted it (a new device under the old names, as a re-plugged NIC would be).
    pub fn connect(&self) {
        let (a, b, a_if, b_if) = (&self.a, &self.b, self.a_if, self.b_if);
        let (a_mac, b_mac) = (Self::A_MAC, Self::B_MAC);
        sh(&[
            "ip", "-n", &a.name, "link", "add", a_if, "address", a_mac, "type", "veth", "peer",
            "name", b_if, "address", b_mac, "netns", &b.name,
        ]);
        for (ns, ifname, addr, peer, peer_mac) in
            [(a, a_if, self.a_addr, self.b_addr, b_mac), (b, b_if, self.b_addr, self.a_addr, a_mac)]
        {
            ns.exec(&["ip", "addr", "add", &format!("{addr}/24"), "dev", ifname]);
            ns.exec(&["ip", "link", "set", ifname, "up"]);
            ns.exec(&[
                "ip",
                "neigh",
                "replace",
                peer,
                "lladdr",
                peer_mac,
                "dev",
                ifname,
                "nud",
                "permanent",
            ]);
        }
    }
}
