//! Kernel structure offsets from BTF (`struct sock`, `sk_buff`'s control block, `struct net`),
//! patched into the programs at load, and this process's network namespace: what lets the
//! programs read sockets directly and tell namespaces apart. Each missing piece degrades one
//! feature with a note instead of failing.

use std::fs;

use btf_rs::{Btf, BtfType, Type};
use linkpilot_common::KernelOffsets;

use crate::paths::{PROC_SELF_NS_NET, VMLINUX_BTF};

/// Offsets of kernel structure fields, from the kernel's BTF, and the network namespace this
/// process runs in (the one whose interfaces it watches). A kernel without BTF, or whose layout we
/// cannot find, yields zero offsets: retransmissions are then counted per skb, or sockets of
/// every namespace whose addresses match are counted; the returned notes say so.
pub fn kernel_offsets(retransmit_has_err: bool) -> (KernelOffsets, Vec<String>) {
    let mut offsets = KernelOffsets {
        retransmit_has_err: u32::from(retransmit_has_err),
        ..KernelOffsets::default()
    };
    let mut notes = Vec::new();
    match skb_tcp_gso_segs_offset() {
        Ok(off) => offsets.skb_tcp_gso_segs = off,
        Err(why) => {
            notes.push(format!("retransmissions are counted per skb, not per segment: {why}"))
        }
    }
    match sock_offsets(&mut offsets) {
        Ok(()) => offsets.sock_known = 1,
        Err(why) => notes.push(format!(
            "retransmissions are read from the tcp:tcp_retransmit_skb tracepoint, which the \
             kernel skips on a CPU where another tracing program is running: {why}"
        )),
    }
    match netns_offsets().and_then(|o| Ok((o, own_netns_inum()?))) {
        Ok(((sock_net, net_inum), inum)) => {
            offsets.sock_net = sock_net;
            offsets.net_inum = net_inum;
            offsets.netns_inum = inum;
        }
        Err(why) => notes.push(format!(
            "TCP events of other network namespaces with the same addresses are counted too: {why}"
        )),
    }
    (offsets, notes)
}

/// The kernel's BTF, read whole first: btf-rs's file reader seeks for every type (about 250,000
/// lseek calls, most of the daemon's start-up time), while a slice costs none.
fn vmlinux_btf() -> Result<Btf, String> {
    let bytes = fs::read(VMLINUX_BTF).map_err(|e| format!("reading {VMLINUX_BTF}: {e}"))?;
    Btf::from_bytes(&bytes).map_err(|e| format!("parsing {VMLINUX_BTF}: {e}"))
}

/// `offsetof(struct sock, __sk_common.skc_net)` and `offsetof(struct net, ns.inum)`.
/// (`possible_net_t` holds the `struct net *` as its only member, at 0.)
fn netns_offsets() -> Result<(u32, u32), String> {
    let btf = vmlinux_btf()?;
    let sock_net = member_offset(&btf, "sock", "__sk_common")?
        + member_offset(&btf, "sock_common", "skc_net")?;
    let inum = member_offset(&btf, "net", "ns")? + member_offset(&btf, "ns_common", "inum")?;
    let cast = |v: usize| u32::try_from(v).map_err(|_| "offset out of range".to_owned());
    Ok((cast(sock_net)?, cast(inum)?))
}

/// The inode number of this process's network namespace (what `stat -L /proc/self/ns/net`
/// prints), which the kernel keeps in `net->ns.inum`.
pub fn own_netns_inum() -> Result<u32, String> {
    use std::os::unix::fs::MetadataExt as _;
    let meta = fs::metadata(PROC_SELF_NS_NET).map_err(|e| format!("{PROC_SELF_NS_NET}: {e}"))?;
    u32::try_from(meta.ino()).map_err(|_| format!("{PROC_SELF_NS_NET}: inode out of range"))
}

/// The offsets in `struct sock` of what the retransmission program reads: family, ports and
/// addresses, all in `__sk_common` (which opens `struct sock`).
fn sock_offsets(offsets: &mut KernelOffsets) -> Result<(), String> {
    let btf = vmlinux_btf()?;
    let common = member_offset(&btf, "sock", "__sk_common")?;
    let at = |member: &str| -> Result<u32, String> {
        let off = common + member_offset(&btf, "sock_common", member)?;
        u32::try_from(off).map_err(|_| format!("{member}: offset out of range"))
    };
    offsets.sock_family = at("skc_family")?;
    offsets.sock_num = at("skc_num")?;
    offsets.sock_dport = at("skc_dport")?;
    offsets.sock_rcv_saddr = at("skc_rcv_saddr")?;
    offsets.sock_daddr = at("skc_daddr")?;
    offsets.sock_v6_rcv_saddr = at("skc_v6_rcv_saddr")?;
    offsets.sock_v6_daddr = at("skc_v6_daddr")?;
    Ok(())
}

/// `offsetof(struct sk_buff, cb) + offsetof(struct tcp_skb_cb, tcp_gso_segs)`.
fn skb_tcp_gso_segs_offset() -> Result<u32, String> {
    let btf = vmlinux_btf()?;
    let cb = member_offset(&btf, "sk_buff", "cb")?;
    let segs = member_offset(&btf, "tcp_skb_cb", "tcp_gso_segs")?;
    u32::try_from(cb + segs).map_err(|_| "offset out of range".to_owned())
}

/// Byte offset of `member` in `struct name`, looking through anonymous structs and unions.
fn member_offset(btf: &Btf, name: &str, member: &str) -> Result<usize, String> {
    let types = btf.resolve_types_by_name(name).map_err(|e| format!("BTF has no {name}: {e}"))?;
    let s = types
        .iter()
        .find_map(|t| match t {
            Type::Struct(s) if !s.members.is_empty() => Some(s),
            _ => None,
        })
        .ok_or_else(|| format!("BTF has no struct {name}"))?;
    find_member(btf, s, member, 0, 4)?
        .ok_or_else(|| format!("struct {name} has no member {member}"))
}

fn find_member(
    btf: &Btf,
    s: &btf_rs::Struct,
    member: &str,
    base_bits: usize,
    depth: u8,
) -> Result<Option<usize>, String> {
    for m in &s.members {
        let bits = base_bits + m.bit_offset() as usize;
        let name = match m.get_name_offset() {
            Some(_) => btf.resolve_name(m).unwrap_or_default(),
            None => String::new(),
        };
        if name == member {
            return Ok(Some(bits / 8));
        }
        if name.is_empty() && depth > 0 {
            if let Ok(Type::Struct(inner) | Type::Union(inner)) = btf.resolve_chained_type(m) {
                if let Some(off) = find_member(btf, &inner, member, bits, depth - 1)? {
                    return Ok(Some(off));
                }
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btf_offsets_of_this_kernel() {
        // Every kernel this project supports has BTF; the value is sanity-checked against the
        // known layout (cb follows 40 bytes of list/socket pointers, tcp_gso_segs is 8 into cb).
        if !std::path::Path::new(VMLINUX_BTF).exists() {
            return;
        }
        let btf = Btf::from_file(VMLINUX_BTF).unwrap();
        assert_eq!(member_offset(&btf, "tcp_skb_cb", "tcp_gso_segs").unwrap(), 8);
        assert_eq!(member_offset(&btf, "sk_buff", "cb").unwrap(), 40);
        assert!(member_offset(&btf, "sk_buff", "no_such_member").is_err());
        // In sock_common, skc_net follows addresses, hash, ports, family/state, the bound
        // device, the bind node and the proto pointer; ns_common keeps inum after its type and
        // two pointers.
        let (sock_net, net_inum) = netns_offsets().unwrap();
        assert_eq!(sock_net, 48);
        assert_eq!(member_offset(&btf, "ns_common", "inum").unwrap(), 24);
        assert!(net_inum >= 24);
        // sock_common opens with the address pair, the hash, the port pair (remote first) and
        // the family, a layout the kernel's lookups have kept for decades; the IPv6 addresses
        // come after the pointers, the remote one first.
        let mut o = KernelOffsets::default();
        sock_offsets(&mut o).unwrap();
        let got = (o.sock_daddr, o.sock_rcv_saddr, o.sock_dport, o.sock_num, o.sock_family);
        assert_eq!(got, (0, 4, 12, 14, 16));
        assert!(o.sock_v6_daddr > sock_net && o.sock_v6_rcv_saddr == o.sock_v6_daddr + 16, "{o:?}");
    }

    #[test]
    fn own_netns_is_what_stat_prints() {
        let out = std::process::Command::new("stat")
            .args(["-L", "-c", "%i", "/proc/self/ns/net"])
            .output()
            .unwrap();
        let stat: u32 = String::from_utf8(out.stdout).unwrap().trim().parse().unwrap();
        assert_eq!(own_netns_inum().unwrap(), stat);
    }
}
