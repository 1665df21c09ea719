//! What linkpilot needs from the running kernel, checked up front so that a missing privilege or
//! feature is one clear error instead of a syscall failure deep inside loading.

use std::{fs, path::PathBuf};

use btf_rs::{Btf, BtfType, Type};
use linkpilot_common::{probe_record, retransmit_record, sock_state_record, KernelOffsets};

use crate::paths::{PROC_SELF_NS_NET, PROC_SELF_STATUS, TRACEFS, TRACEFS_LEGACY, VMLINUX_BTF};

/// A kernel prerequisite that is not met.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "missing privileges: loading and attaching eBPF programs needs root, or CAP_BPF, \
         CAP_NET_ADMIN and CAP_PERFMON (missing: {missing})"
    )]
    MissingCapabilities { missing: String },
    #[error(
        "tracefs is not mounted (looked in {TRACEFS} and {TRACEFS_LEGACY}) and mounting it for \
         this process failed ({why}); mount it with `mount -t tracefs nodev {TRACEFS}` \
         (`cargo xtask setup` does this)"
    )]
    NoTracefs { why: String },
    #[error("tracepoint {name} is not available in this kernel ({path} is missing)")]
    NoTracepoint { name: String, path: String },
    #[error(
        "tracepoint {tracepoint}: field {field} is at offset {found:?} in this kernel, linkpilot \
         reads it at {expected}; this kernel's record layout is not supported"
    )]
    TracepointLayout {
        tracepoint: String,
        field: &'static str,
        expected: usize,
        found: Option<usize>,
    },
    #[error("reading {path}: {source}")]
    Read { path: String, source: std::io::Error },
}

const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Checks that this process may load and attach our programs.
pub fn check_privileges() -> Result<(), KernelError> {
    let status = fs::read_to_string(PROC_SELF_STATUS)
        .map_err(|source| KernelError::Read { path: PROC_SELF_STATUS.into(), source })?;
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    missing_capabilities(eff)
        .map_or(Ok(()), |missing| Err(KernelError::MissingCapabilities { missing }))
}

fn missing_capabilities(eff: u64) -> Option<String> {
    let has = |cap: u32| eff & (1u64 << cap) != 0;
    // Before CAP_BPF/CAP_PERFMON existed, CAP_SYS_ADMIN covered both.
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !has(CAP_SYS_ADMIN) {
        missing.push("CAP_PERFMON");
    }
    if !has(CAP_NET_ADMIN) {
        missing.push("CAP_NET_ADMIN");
    }
    (!missing.is_empty()).then(|| missing.join(", "))
}

/// The tracefs mount point.
pub fn tracefs() -> Result<PathBuf, KernelError> {
    [TRACEFS, TRACEFS_LEGACY]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
        .ok_or(KernelError::NoTracefs { why: "not tried".into() })
}

/// tracefs, mounted for this process if it is not there: `ip netns exec` gives its command a
/// fresh /sys without it. The mount goes into a mount namespace of our own (a slave of the one
/// we came from, so nothing propagates back): nobody else sees it, and it ends with us.
/// Needs CAP_SYS_ADMIN; without it, the error says how to mount tracefs instead.
pub fn ensure_tracefs() -> Result<PathBuf, KernelError> {
    if let Ok(p) = tracefs() {
        return Ok(p);
    }
    let why = match mount_own_tracefs() {
        Ok(()) => match tracefs() {
            Ok(p) => {
                tracing::info!(
                    "tracefs was not mounted here: mounted it at {TRACEFS} for this process"
                );
                return Ok(p);
            }
            Err(_) => format!("mounted at {TRACEFS}, but it has no events/"),
        },
        Err(e) => e,
    };
    Err(KernelError::NoTracefs { why })
}

fn mount_own_tracefs() -> Result<(), String> {
    use nix::{
        mount::{mount, MsFlags},
        sched::{unshare, CloneFlags},
    };
    if !std::path::Path::new(TRACEFS).is_dir() {
        return Err(format!("{TRACEFS} does not exist to mount it on"));
    }
    // Before any thread starts: a threaded process cannot leave its mount namespace.
    unshare(CloneFlags::CLONE_NEWNS).map_err(|e| format!("a mount namespace of our own: {e}"))?;
    let none = None::<&str>;
    mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_SLAVE, none)
        .map_err(|e| format!("making our mounts private: {e}"))?;
    mount(Some("nodev"), TRACEFS, Some("tracefs"), MsFlags::empty(), none)
        .map_err(|e| format!("mount -t tracefs nodev {TRACEFS}: {e}"))
}

/// Field name -> offset, from a tracefs `format` file.
fn format_offsets(format: &str) -> Vec<(String, usize)> {
    // Lines look like: "\tfield:__u16 family;\toffset:32;\tsize:2;\tsigned:0;"
    format
        .lines()
        .filter_map(|line| {
            let decl = line.trim().strip_prefix("field:")?.split(';').next()?;
            let name = decl.rsplit([' ', '*']).next()?.split('[').next()?.to_owned();
            let off = line.split("offset:").nth(1)?.split(';').next()?.trim().parse().ok()?;
            Some((name, off))
        })
        .collect()
}

/// Checks that `tcp:tcp_retransmit_skb` exists and has the layout the program reads; returns
/// whether it carries the `err` field.
pub fn check_retransmit_tracepoint() -> Result<bool, KernelError> {
    let format = tracepoint_format("tcp", "tcp_retransmit_skb")?;
    check_retransmit_layout(&format)
}

/// The tracefs `format` file of tracepoint `category:event`.
fn tracepoint_format(category: &str, event: &str) -> Result<String, KernelError> {
    let path = tracefs()?.join(format!("events/{category}/{event}/format"));
    fs::read_to_string(&path).map_err(|_| KernelError::NoTracepoint {
        name: format!("{category}:{event}"),
        path: path.display().to_string(),
    })
}

/// Checks that every `(field, offset)` of `expected` is where the program reads it.
fn check_layout(
    tracepoint: &str,
    format: &str,
    expected: &[(&'static str, usize)],
) -> Result<(), KernelError> {
    let fields = format_offsets(format);
    for &(field, expected) in expected {
        let found = fields.iter().find(|(n, _)| n == field).map(|(_, o)| *o);
        if found != Some(expected) {
            return Err(KernelError::TracepointLayout {
                tracepoint: tracepoint.into(),
                field,
                expected,
                found,
            });
        }
    }
    Ok(())
}

/// Checks that `tcp:tcp_probe` exists and has the layout the RTT program reads.
pub fn check_probe_tracepoint() -> Result<(), KernelError> {
    let name = "tcp:tcp_probe";
    let format = tracepoint_format("tcp", "tcp_probe")?;
    use probe_record as r;
    check_layout(
        name,
        &format,
        &[
            ("saddr", r::SADDR),
            ("daddr", r::DADDR),
            ("sport", r::SPORT),
            ("dport", r::DPORT),
            ("family", r::FAMILY),
            ("snd_nxt", r::SND_NXT),
            ("snd_una", r::SND_UNA),
            ("snd_cwnd", r::SND_CWND),
            ("srtt", r::SRTT),
            ("skaddr", r::SKADDR),
        ],
    )
}

/// Checks that `sock:inet_sock_set_state` exists and has the layout the flow program reads.
pub fn check_sock_state_tracepoint() -> Result<(), KernelError> {
    let name = "sock:inet_sock_set_state";
    let format = tracepoint_format("sock", "inet_sock_set_state")?;
    use sock_state_record as r;
    check_layout(
        name,
        &format,
        &[
            ("skaddr", r::SKADDR),
            ("oldstate", r::OLDSTATE),
            ("newstate", r::NEWSTATE),
            ("sport", r::SPORT),
            ("dport", r::DPORT),
            ("family", r::FAMILY),
            ("protocol", r::PROTOCOL),
            ("saddr", r::SADDR),
            ("daddr", r::DADDR),
            ("saddr_v6", r::SADDR_V6),
            ("daddr_v6", r::DADDR_V6),
        ],
    )
}

fn check_retransmit_layout(format: &str) -> Result<bool, KernelError> {
    use retransmit_record as r;
    check_layout(
        "tcp:tcp_retransmit_skb",
        format,
        &[
            ("skbaddr", r::SKBADDR),
            ("skaddr", r::SKADDR),
            ("sport", r::SPORT),
            ("dport", r::DPORT),
            ("family", r::FAMILY),
            ("saddr", r::SADDR),
            ("daddr", r::DADDR),
            ("saddr_v6", r::SADDR_V6),
            ("daddr_v6", r::DADDR_V6),
        ],
    )?;
    let fields = format_offsets(format);
    let offset_of = |f: &str| fields.iter().find(|(n, _)| n == f).map(|(_, o)| *o);
    match offset_of("err") {
        None => Ok(false),
        Some(o) if o == retransmit_record::ERR => Ok(true),
        found => Err(KernelError::TracepointLayout {
            tracepoint: "tcp:tcp_retransmit_skb".into(),
            field: "err",
            expected: retransmit_record::ERR,
            found,
        }),
    }
}

/// Everything `watch` and `run` need from the kernel, checked before anything is loaded:
/// privileges (unless `capabilities` is false: then the kernel judges, syscall by syscall), the
/// three tracepoints' layouts, and the structure offsets (a note is logged when BTF is missing
/// and skbs are counted instead of segments).
pub fn preflight(capabilities: bool) -> Result<KernelOffsets, KernelError> {
    if capabilities {
        check_privileges()?;
    }
    ensure_tracefs()?;
    let has_err = check_retransmit_tracepoint()?;
    check_probe_tracepoint()?;
    check_sock_state_tracepoint()?;
    let (offsets, notes) = kernel_offsets(has_err);
    for note in notes {
        tracing::warn!("{note}");
    }
    Ok(offsets)
}

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

/// The congestion control algorithms this kernel offers
/// (`net.ipv4.tcp_available_congestion_control`, read under `proc_sys`).
pub fn congestion_controls(proc_sys: &std::path::Path) -> std::io::Result<Vec<String>> {
    let text = std::fs::read_to_string(proc_sys.join("net/ipv4/tcp_available_congestion_control"))?;
    Ok(text.split_whitespace().map(str::to_owned).collect())
}

/// Asks the kernel for congestion control `name` on a socket that is closed unused: with
/// CAP_NET_ADMIN the kernel loads its module (`tcp_<name>`) if it is not loaded yet, as writing
/// `net.ipv4.tcp_congestion_control` would. Distribution kernels ship BBR as a module that
/// nothing loads until asked. Nothing else on the host changes.
pub fn load_congestion_control(name: &str) -> std::io::Result<()> {
    use socket2::{Domain, Socket, Type};
    Socket::new(Domain::IPV4, Type::STREAM, None)?.set_tcp_congestion(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT_6_18: &str = "name: tcp_retransmit_skb\nID: 2281\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;\n\
\tfield:const void * skaddr;\toffset:16;\tsize:8;\tsigned:0;\n\
\tfield:int state;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:__u16 family;\toffset:32;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr[4];\toffset:34;\tsize:4;\tsigned:0;\n\
\tfield:__u8 daddr[4];\toffset:38;\tsize:4;\tsigned:0;\n\
\tfield:__u16 sport;\toffset:28;\tsize:2;\tsigned:0;\n\
\tfield:__u16 dport;\toffset:30;\tsize:2;\tsigned:0;\n\
\tfield:__u8 saddr_v6[16];\toffset:42;\tsize:16;\tsigned:0;\n\
\tfield:__u8 daddr_v6[16];\toffset:58;\tsize:16;\tsigned:0;\n\
\tfield:int err;\toffset:76;\tsize:4;\tsigned:1;\n";

    #[test]
    fn parses_tracefs_format() {
        let f = format_offsets(FORMAT_6_18);
        assert!(f.contains(&("skbaddr".to_owned(), 8)));
        assert!(f.contains(&("saddr_v6".to_owned(), 42)));
        assert!(check_retransmit_layout(FORMAT_6_18).unwrap());
        let without_err: String =
            FORMAT_6_18.lines().filter(|l| !l.contains(" err;")).collect::<Vec<_>>().join("\n");
        assert!(!check_retransmit_layout(&without_err).unwrap());
    }

    #[test]
    fn layout_mismatch_names_the_field() {
        let moved = FORMAT_6_18.replace("family;\toffset:32", "family;\toffset:36");
        let err = check_retransmit_layout(&moved).unwrap_err().to_string();
        assert!(err.contains("field family is at offset Some(36)"), "{err}");
    }

    #[test]
    fn asking_for_a_congestion_control() {
        // Reno is built into every kernel and allowed to every socket.
        load_congestion_control("reno").unwrap();
        let e = load_congestion_control("no_such_cc").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    }

    #[test]
    fn capabilities() {
        assert_eq!(missing_capabilities(u64::MAX), None);
        assert_eq!(missing_capabilities(1 << CAP_SYS_ADMIN | 1 << CAP_NET_ADMIN), None);
        assert_eq!(missing_capabilities(1 << CAP_BPF), Some("CAP_PERFMON, CAP_NET_ADMIN".into()));
        assert_eq!(missing_capabilities(0), Some("CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN".into()));
    }

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
