//! The TCP flows of the jobs that report: the established connections, in the daemon's own
//! network namespace (the one it watches, where the flow table's flows live), owned by the
//! user who owns a live job report. With them the daemon tells the congestion marks on a job's
//! own flows from the marks on everyone else's.
//!
//! By owner, not by process: the kernel gives each socket's owner in `/proc/net/tcp{,6}`, and a
//! report file's owner is whoever created it (the directory is sticky, the writer creates with
//! O_EXCL), so a user can only make their own connections a job's, and reading them needs no
//! privilege: no ptrace access to other users' processes, nothing of theirs under /proc. The
//! cost of that: every connection of a reporting user counts as the job's, whatever process
//! holds it (a job run as root takes every root connection in the namespace along).

use std::{collections::HashSet, fs, os::unix::fs::MetadataExt, path::Path};

use linkpilot_common::{v4_mapped, FlowKey, AF_INET, AF_INET6};

/// `TCP_ESTABLISHED` as `/proc/net/tcp` prints it.
const ESTABLISHED: &str = "01";

/// The owners (uids) of the report files `names` in `dir` (each a live process's, as the scan
/// found it); a name that is no longer a regular file is skipped.
pub fn report_owners(dir: &Path, names: &[String]) -> HashSet<u32> {
    names
        .iter()
        .filter_map(|n| fs::symlink_metadata(dir.join(n)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.uid())
        .collect()
}

/// The established TCP connections of this network namespace owned by one of `owners`.
pub fn job_flows(owners: &HashSet<u32>) -> HashSet<FlowKey> {
    if owners.is_empty() {
        return HashSet::new();
    }
    let mut flows = HashSet::new();
    for (file, family) in [("/proc/net/tcp", AF_INET), ("/proc/net/tcp6", AF_INET6)] {
        // No IPv6 (or a table that cannot be read): no flows of that family.
        let Ok(text) = fs::read_to_string(file) else { continue };
        flows.extend(
            parse_proc_net_tcp(&text, family)
                .into_iter()
                .filter(|(uid, _)| owners.contains(uid))
                .map(|(_, k)| k),
        );
    }
    flows
}

/// (owner uid, flow key) of each established connection in `/proc/net/tcp` (`family`
/// AF_INET) or `/proc/net/tcp6` (AF_INET6) text.
fn parse_proc_net_tcp(text: &str, family: u16) -> Vec<(u32, FlowKey)> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().take(8).collect();
            if f.len() < 8 || f[3] != ESTABLISHED {
                return None;
            }
            let (local, local_port) = endpoint(f[1])?;
            let (remote, remote_port) = endpoint(f[2])?;
            let key = FlowKey { family, local_port, remote_port, _pad: 0, local, remote };
            Some((f[7].parse().ok()?, key))
        })
        .collect()
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): the kernel prints each 32-bit
/// word of the address as it lies in memory, read as a native integer; the port in hex.
fn endpoint(s: &str) -> Option<([u8; 16], u16)> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let word = |i: usize| -> Option<[u8; 4]> {
        Some(u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok()?.to_ne_bytes())
    };
    let bytes = match addr.len() {
        8 => v4_mapped(word(0)?),
        32 => {
            let mut a = [0u8; 16];
            for i in 0..4 {
                a[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            a
        }
        _ => return None,
    };
    Some((bytes, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_tcp_rows_become_flow_keys() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100000A:1451 0200000A:D431 01 00000000:00000000 00:00000000 00000000  1000        0 4242 1 0000000000000000 20 4 30 10 -1\n   1: 0100000A:1451 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4243 1\n";
        let rows = parse_proc_net_tcp(v4, AF_INET);
        assert_eq!(rows.len(), 1, "the listener is not a flow");
        let (uid, k) = rows[0];
        assert_eq!(uid, 1000);
        assert_eq!(k.local, v4_mapped([10, 0, 0, 1]));
        assert_eq!(k.remote, v4_mapped([10, 0, 0, 2]));
        assert_eq!((k.local_port, k.remote_port, k.family), (5201, 54321, AF_INET));
        // A dual-stack socket's IPv4 peer, as tcp6 prints it.
        let v6 = "  sl  local_address                         remote_address                        st\n   0: 0000000000000000FFFF00000100000A:1451 0000000000000000FFFF00000200000A:D431 01 00000000:00000000 00:00000000 00000000     0        0 77 1\n";
        let rows = parse_proc_net_tcp(v6, AF_INET6);
        assert_eq!(rows[0].1.local, v4_mapped([10, 0, 0, 1]), "{:?}", rows[0].1.local);
        assert_eq!(rows[0].1.family, AF_INET6);
        for bad in [
            "header\n 0: zz:1 00:00 01 a b c d e f\n",
            "header\n 0: 0100000A:1451 0200000A:D431 01 a b c x\n",
        ] {
            assert!(parse_proc_net_tcp(bad, AF_INET).is_empty(), "{bad}");
        }
    }

    #[test]
    fn a_reports_owner_has_its_connections_found() {
        let dir = std::env::temp_dir().join(format!("lp-jobflows-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let name = format!("{}-0123456789abcdef", std::process::id());
        fs::write(dir.join(&name), b"x").unwrap();
        let me = fs::metadata(dir.join(&name)).unwrap().uid();
        assert_eq!(report_owners(&dir, &[name, "gone".into()]), [me].into());
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, _) = l.accept().unwrap();
        let port = c.local_addr().unwrap().port();
        let flows = job_flows(&[me].into());
        assert!(flows.iter().any(|k| k.local_port == port), "{port} not in {flows:?}");
        let others = job_flows(&[me.wrapping_add(1)].into());
        assert!(others.iter().all(|k| k.local_port != port), "another user's");
        fs::remove_dir_all(&dir).unwrap();
    }
}
