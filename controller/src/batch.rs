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
pub fn lookup_all<K: Pod, V: Pod>(map: &impl AsFd, max: usize) -> io::Result<Vec<(K, V)>> {
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
        // SAFETY: `attr` points at buffers of CHUNK keys and values, which is the most the
        // kernel writes (`count`); `attr` outlives the call.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &raw mut attr,
                size_of::<BatchAttr>() as libc::c_uint,
            )
        };
        let done = if rc < 0 {
            let e = io::Error::last_os_error();
            // ENOENT: the walk reached the end; `count` still says what this call filled.
            if e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
            true
        } else {
            false
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
