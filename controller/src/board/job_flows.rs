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
//!
//! A job in its own network namespace (a pod without the host's network) has no connection in
//! the daemon's: with a policy's `job_namespaces`, the namespace its report names is the job's,
//! every flow in it (the programs tell a socket's namespace).

use std::{
    collections::{BTreeSet, HashSet},
    fs,
    os::unix::fs::MetadataExt,
    path::Path,
};

use linkpilot_common::{FlowKey, MAX_JOB_NAMESPACES};

use crate::{
    board::job_reports::JobReport,
    kernel::{probes::JobNetns, sockets},
};

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

/// The own network namespaces the reports name (not `own`, the daemon's, whose flows are
/// found by owner), each with the interface its flows count on: `iface_of` the report's link
/// (None: the policy's first). A report that names no namespace, or a link `iface_of` does not
/// know, gives none. At most [`MAX_JOB_NAMESPACES`], the rest left out.
///
/// The namespace is the writer's word, as the rest of its report is; in one the daemon acts
/// only as it does in its own: the peers' connections get the link's profile and count as the
/// job's.
pub fn job_namespaces<'a>(
    reports: impl IntoIterator<Item = &'a JobReport>,
    own: u32,
    iface_of: impl Fn(Option<&str>) -> Option<u32>,
) -> BTreeSet<JobNetns> {
    reports
        .into_iter()
        .filter_map(|r| {
            let inum = r.netns.filter(|&n| n != 0 && n != own)?;
            let ifindex = iface_of(r.link.as_deref())?;
            Some(JobNetns { inum, cookie: r.netns_cookie.unwrap_or(0), ifindex })
        })
        .take(MAX_JOB_NAMESPACES as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespaces_reports_name_other_than_the_daemons() {
        let report = |netns: Option<u32>, cookie: Option<u64>, link: Option<&str>| {
            let mut r = crate::board::job_reports::parse(&sample_report()).unwrap();
            (r.netns, r.netns_cookie, r.link) = (netns, cookie, link.map(str::to_owned));
            r
        };
        let reports = [
            report(Some(7), Some(70), None),
            report(Some(7), Some(70), None), // a second rank of the same pod
            report(Some(8), None, Some("roce")),
            report(Some(1), Some(10), None), // the daemon's own
            report(None, None, None),
            report(Some(9), Some(90), Some("gone")),
        ];
        let iface_of = |link: Option<&str>| match link {
            None => Some(3),
            Some("roce") => Some(4),
            Some(_) => None,
        };
        let got = job_namespaces(&reports, 1, iface_of);
        let want: BTreeSet<JobNetns> = [
            JobNetns { inum: 7, cookie: 70, ifindex: 3 },
            JobNetns { inum: 8, cookie: 0, ifindex: 4 },
        ]
        .into();
        assert_eq!(got, want);
    }

    fn sample_report() -> Vec<u8> {
        let mut b = br#"{"version":1,"job":"j","rank":0,"world":1,"kind":"ddp","steps":0,"step_s":0,"compute_s":0,"wait_s":0,"wire_bytes":0,"codec":"none"}"#.to_vec();
        b.resize(crate::board::job_reports::REPORT_SIZE, b' ');
        b
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
