//! RDMA netlink (NETLINK_RDMA, the nldev client): which netdev each RDMA port is bound to, as
//! the kernel tells this network namespace. The kernel names a port's netdev only when it is in
//! the asking socket's namespace (nldev.c, `fill_port_info`: `net_eq(dev_net(netdev), net)`),
//! which is what sysfs cannot say: its `gid_attrs/ndevs` names are names in whatever
//! namespace each netdev lives in.

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
};

const NETLINK_RDMA: i32 = 20;
const RDMA_NL_NLDEV: u16 = 5;
const CMD_GET: u16 = 1;
const CMD_PORT_GET: u16 = 5;
const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_PORT_INDEX: u16 = 3;
const ATTR_NDEV_INDEX: u16 = 50;
const ATTR_NDEV_NAME: u16 = 51;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const HEADER: usize = 16;

/// (device, port) -> (ifindex, name) of the port's netdev, for ports whose netdev is in this
/// network namespace.
pub type PortNetdevs = BTreeMap<(String, u32), (u32, String)>;

/// One message's attributes: (type, payload).
type Attrs = Vec<(u16, Vec<u8>)>;

/// Asks the kernel; an error if it has no RDMA netlink (no RDMA subsystem) or refuses.
pub fn port_netdevs() -> io::Result<PortNetdevs> {
    // SAFETY: plain socket(2); the descriptor is owned below.
    let fd = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, NETLINK_RDMA)
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nothing else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval { tv_sec: 2, tv_usec: 0 };
    // SAFETY: a timeval of the size given; a blocked reply cannot hang the daemon.
    unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const timeout).cast(),
            size_of::<libc::timeval>() as u32,
        )
    };
    let mut out = PortNetdevs::new();
    for dev in dump(&sock, CMD_GET, &[])? {
        let Some(index) = u32_attr(&dev, ATTR_DEV_INDEX) else { continue };
        let mut payload = attr_header(ATTR_DEV_INDEX, 4);
        payload.extend(index.to_ne_bytes());
        for port in dump(&sock, CMD_PORT_GET, &payload)? {
            if let Some((key, netdev)) = port_entry(&port) {
                out.insert(key, netdev);
            }
        }
    }
    Ok(out)
}

/// A port message's ((device, port), (netdev ifindex, netdev name)), if it names a netdev.
fn port_entry(a: &Attrs) -> Option<((String, u32), (u32, String))> {
    let key = (str_attr(a, ATTR_DEV_NAME)?, u32_attr(a, ATTR_PORT_INDEX)?);
    Some((key, (u32_attr(a, ATTR_NDEV_INDEX)?, str_attr(a, ATTR_NDEV_NAME)?)))
}

fn attr_header(kind: u16, len: usize) -> Vec<u8> {
    let mut v = ((4 + len) as u16).to_ne_bytes().to_vec();
    v.extend(kind.to_ne_bytes());
    v
}

fn u32_attr(a: &Attrs, kind: u16) -> Option<u32> {
    let (_, v) = a.iter().find(|(k, _)| *k == kind)?;
    Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?))
}

fn str_attr(a: &Attrs, kind: u16) -> Option<String> {
    let (_, v) = a.iter().find(|(k, _)| *k == kind)?;
    let end = v.iter().position(|&b| b == 0).unwrap_or(v.len());
    String::from_utf8(v[..end].to_vec()).ok()
}

/// Sends one dump request and collects every answer's attributes until NLMSG_DONE.
fn dump(sock: &OwnedFd, cmd: u16, payload: &[u8]) -> io::Result<Vec<Attrs>> {
    let mut req = ((HEADER + payload.len()) as u32).to_ne_bytes().to_vec();
    req.extend(((RDMA_NL_NLDEV << 10) + cmd).to_ne_bytes());
    req.extend(((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    req.extend(1u32.to_ne_bytes()); // sequence
    req.extend(0u32.to_ne_bytes()); // port id: the kernel's
    req.extend(payload);
    // SAFETY: sending the bytes of `req`.
    if unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        // SAFETY: receiving into `buf`, at most its length.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if parse(&buf[..n as usize], &mut out)? {
            return Ok(out);
        }
    }
}

/// Adds the attributes of each message in `buf` to `out`; true at NLMSG_DONE.
fn parse(mut buf: &[u8], out: &mut Vec<Attrs>) -> io::Result<bool> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "a malformed RDMA netlink message");
    while buf.len() >= HEADER {
        let len = u32::from_ne_bytes(buf[..4].try_into().map_err(|_| bad())?) as usize;
        let kind = u16::from_ne_bytes([buf[4], buf[5]]);
        if len < HEADER || len > buf.len() {
            return Err(bad());
        }
        let body = &buf[HEADER..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let code = i32::from_ne_bytes(body.get(..4).ok_or_else(bad)?.try_into().unwrap());
                if code != 0 {
                    return Err(io::Error::from_raw_os_error(-code));
                }
            }
            _ => out.push(attrs(body).ok_or_else(bad)?),
        }
        buf = &buf[len.next_multiple_of(4).min(buf.len())..];
    }
    Ok(false)
}

fn attrs(mut b: &[u8]) -> Option<Attrs> {
    let mut out = Vec::new();
    while b.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let kind = u16::from_ne_bytes([b[2], b[3]]) & 0x3fff; // without NESTED/BYTEORDER
        if len < 4 || len > b.len() {
            return None;
        }
        out.push((kind, b[4..len].to_vec()));
        b = &b[len.next_multiple_of(4).min(b.len())..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, v: &[u8]) -> Vec<u8> {
        let mut a = attr_header(kind, v.len());
        a.extend(v);
        a.resize(a.len().next_multiple_of(4), 0);
        a
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = ((HEADER + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend(kind.to_ne_bytes());
        m.extend([0u8; 10]);
        m.extend(body);
        m
    }

    #[test]
    fn port_answers_name_a_netdev_only_when_the_kernel_gave_one() {
        let here = [
            attr(ATTR_DEV_INDEX, &1u32.to_ne_bytes()),
            attr(ATTR_DEV_NAME, b"mlx5_0\0"),
            attr(ATTR_PORT_INDEX, &1u32.to_ne_bytes()),
            attr(ATTR_NDEV_INDEX, &7u32.to_ne_bytes()),
            attr(ATTR_NDEV_NAME, b"eth2\0"),
        ]
        .concat();
        // The same device's port 2, whose netdev is in another namespace: no NDEV attributes.
        let elsewhere =
            [attr(ATTR_DEV_NAME, b"mlx5_0\0"), attr(ATTR_PORT_INDEX, &2u32.to_ne_bytes())].concat();
        let kind = (RDMA_NL_NLDEV << 10) + CMD_PORT_GET;
        let buf = [message(kind, &here), message(kind, &elsewhere), message(NLMSG_DONE, &[0; 4])]
            .concat();
        let mut msgs = Vec::new();
        assert!(parse(&buf, &mut msgs).unwrap(), "NLMSG_DONE ends the dump");
        let entries: Vec<_> = msgs.iter().filter_map(port_entry).collect();
        assert_eq!(entries, [(("mlx5_0".to_owned(), 1), (7, "eth2".to_owned()))]);
        let err = message(NLMSG_ERROR, &(-libc::EPERM).to_ne_bytes());
        assert_eq!(parse(&err, &mut msgs).unwrap_err().raw_os_error(), Some(libc::EPERM));
        assert!(parse(&message(kind, &here)[..20], &mut msgs).is_err(), "truncated");
    }
}
