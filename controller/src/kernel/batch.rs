//! Whole-map reads with `BPF_MAP_LOOKUP_BATCH` (Linux 5.6+), which aya 0.14 does not wrap:
//! thousands of entries per syscall instead of two syscalls per entry, which is what keeps a
//! tick cheap with 100k flows (BENCHMARKS.md).

use std::{
    io,
    mem::size_of,
    os::fd::{AsFd, AsRawFd},
};

use aya::Pod;

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_MAP_TYPE_HASH: u32 = 1;
const BPF_MAP_TYPE_LRU_HASH: u32 = 9;

/// `union bpf_attr`'s `info` member.
#[repr(C)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_map_info` (the kernel fills as much as we ask for).
#[repr(C)]
#[derive(Default)]
struct MapInfo {
    map_type: u32,
    id: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    name: [u8; 16],
}

fn map_info(map: &impl AsFd) -> io::Result<MapInfo> {
    let mut info = MapInfo::default();
    let mut attr = InfoAttr {
        bpf_fd: map.as_fd().as_raw_fd() as u32,
        info_len: size_of::<MapInfo>() as u32,
        info: &raw mut info as u64,
    };
    // SAFETY: `info` is as large as `info_len` says; both outlive the call.
    unsafe { sys_bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info)
}

/// `bpf(cmd, attr, sizeof(*attr))`; a negative return is an error, its code in errno.
///
/// # Safety
/// Every pointer in `attr` must be valid for what `cmd` reads and writes there.
unsafe fn sys_bpf<A>(cmd: libc::c_long, attr: &mut A) -> io::Result<()> {
    // SAFETY: the caller vouches for `attr`'s pointers; `attr` itself is valid for its size.
    let rc = unsafe {
        libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, size_of::<A>() as libc::c_uint)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Refuses what the buffers below could not hold: the kernel writes each key and value at the
/// map's own sizes (a per-CPU value once per CPU), whatever `K` and `V` are.
fn check<K, V>(info: &MapInfo) -> io::Result<()> {
    let name = String::from_utf8_lossy(&info.name);
    let name = name.trim_end_matches('\0');
    if ![BPF_MAP_TYPE_HASH, BPF_MAP_TYPE_LRU_HASH].contains(&info.map_type) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "map {name}: type {} is not a hash or LRU hash map (per-CPU maps hold a value \
                 per CPU)",
                info.map_type
            ),
        ));
    }
    let (k, v) = (size_of::<K>(), size_of::<V>());
    if info.key_size as usize != k || info.value_size as usize != v {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "map {name}: keys of {} bytes and values of {} bytes, read as {k} and {v}",
                info.key_size, info.value_size
            ),
        ));
    }
    Ok(())
}

/// `union bpf_attr`'s `batch` member.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Entries fetched per syscall.
const CHUNK: usize = 4096;

/// Every (key, value) of a hash or LRU hash map of `K` -> `V` (not per-CPU), at most `max`.
/// Entries that come and go during the read may be missed or seen once; none is seen twice.
/// A map of another type, or whose key or value size is not `K`'s or `V`'s, is an
/// `InvalidInput` error before anything is read.
pub fn lookup_all<K: Pod, V: Pod>(map: &impl AsFd, max: usize) -> io::Result<Vec<(K, V)>> {
    check::<K, V>(&map_info(map)?)?;
    let mut out = Vec::new();
    let mut keys: Vec<K> = Vec::with_capacity(CHUNK);
    let mut values: Vec<V> = Vec::with_capacity(CHUNK);
    // The kernel's cursor for hash maps is a bucket index (u32); 8 bytes leave room to spare.
    let (mut cursor_in, mut cursor_out) = (0u64, 0u64);
    let mut first = true;
    while out.len() < max {
        let mut attr = BatchAttr {
            in_batch: if first { 0 } else { &raw const cursor_in as u64 },
            out_batch: &raw mut cursor_out as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: CHUNK as u32,
            map_fd: map.as_fd().as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` points at buffers of CHUNK keys and values of the map's own sizes
        // (checked above), which is the most the kernel writes (`count`); `attr` outlives the
        // call.
        let done = match unsafe { sys_bpf(BPF_MAP_LOOKUP_BATCH, &mut attr) } {
            Ok(()) => false,
            // ENOENT: the walk reached the end; `count` still says what this call filled.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(e) => return Err(e),
        };
        let n = (attr.count as usize).min(CHUNK);
        // SAFETY: the kernel initialised the first `n` elements; K and V are Pod.
        unsafe {
            keys.set_len(n);
            values.set_len(n);
        }
        out.extend(keys.drain(..).zip(values.drain(..)));
        if done {
            break;
        }
        cursor_in = cursor_out;
        first = false;
    }
    out.truncate(max);
    Ok(out)
}
