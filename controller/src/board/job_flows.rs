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

use linkpilot_common::FlowKey;

use crate::kernel::sockets;

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
    sockets::established()
        .into_iter()
        .filter(|(uid, _)| owners.contains(uid))
        .map(|(_, k)| k)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

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
