//! RDMA device discovery through libibverbs (the `ibverbs` crate): the devices the verbs
//! library can open, their GUIDs, whether port 1 is usable and which network devices its GIDs
//! belong to. sysfs (`rdma.rs`) supplies the counters; verbs confirms what an application
//! (NCCL) would actually see.

use std::io;

use serde::Serialize;

/// One device as libibverbs reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerbsDevice {
    pub name: String,
    /// Node GUID, as `ibv_devinfo` prints it (`xxxx:xxxx:xxxx:xxxx`).
    pub guid: String,
    /// Port 1 when it opened (ACTIVE or ARMED), or why not.
    pub port1: Result<VerbsPort, String>,
}

/// Port 1 of an opened device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct VerbsPort {
    /// GID table entries.
    pub gids: usize,
    /// RoCE GIDs' network devices (interface names in this namespace), deduplicated.
    pub netdevs: Vec<String>,
}

/// What discovery found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verbs {
    pub devices: Vec<VerbsDevice>,
    /// Why the list is empty when the library could not list at all (no kernel RDMA support),
    /// which is not an error: the node simply has no RDMA.
    pub unavailable: Option<String>,
}

/// Without libibverbs linked in (no `verbs` feature) there is nothing to list.
#[cfg(not(feature = "verbs"))]
pub fn discover() -> io::Result<Verbs> {
    Ok(Verbs {
        devices: Vec::new(),
        unavailable: Some(
            "built without libibverbs (the `verbs` feature: the glibc 2.28 build leaves it out)"
                .into(),
        ),
    })
}

/// Lists the RDMA devices. A kernel without RDMA support (ENOSYS) or without devices gives an
/// empty list; other failures (permissions, memory) are errors.
#[cfg(feature = "verbs")]
pub fn discover() -> io::Result<Verbs> {
    let list = match ibverbs::devices() {
        Ok(list) => list,
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            return Ok(Verbs {
                devices: Vec::new(),
                unavailable: Some("ENOSYS: the kernel has no RDMA support".into()),
            })
        }
        Err(e) => return Err(io::Error::new(e.kind(), format!("listing RDMA devices: {e}"))),
    };
    let devices = list
        .iter()
        .map(|dev| {
            let name = dev.name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let guid = dev.guid().map(|g| format_guid(u64::from(g))).unwrap_or_default();
            let port1 = dev.open().map_err(|e| e.to_string()).map(|ctx| {
                let table = ctx.gid_table();
                let mut netdevs: Vec<String> = table
                    .iter()
                    .filter(|g| g.ndev_ifindex != 0)
                    .filter_map(|g| ifname(g.ndev_ifindex))
                    .collect();
                netdevs.sort();
                netdevs.dedup();
                VerbsPort { gids: table.len(), netdevs }
            });
            VerbsDevice { name, guid, port1 }
        })
        .collect();
    Ok(Verbs { devices, unavailable: None })
}

#[cfg(feature = "verbs")]
fn ifname(ifindex: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: `buf` has the IF_NAMESIZE bytes if_indextoname writes at most.
    let p = unsafe { libc::if_indextoname(ifindex, buf.as_mut_ptr()) };
    // SAFETY: on success `p` is `buf`, NUL-terminated.
    (!p.is_null()).then(|| unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `0x0002c90300a1b2c3` -> `0002:c903:00a1:b2c3`.
#[cfg(any(feature = "verbs", test))]
fn format_guid(g: u64) -> String {
    let w = |i: u32| (g >> (48 - 16 * i)) & 0xffff;
    format!("{:04x}:{:04x}:{:04x}:{:04x}", w(0), w(1), w(2), w(3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guid_like_ibv_devinfo() {
        assert_eq!(format_guid(0x0002_c903_00a1_b2c3), "0002:c903:00a1:b2c3");
    }

    #[test]
    fn discovery_never_fails_for_lack_of_rdma() {
        // This machine has no RDMA: either ENOSYS or an empty list, never an error.
        let v = discover().expect("discovery");
        if v.devices.is_empty() {
            eprintln!("no RDMA devices: {:?}", v.unavailable);
        }
    }
}
