//! `batch::lookup_all` on maps the test makes with the bpf syscall itself: the types must
//! match the map, or the read is refused before the kernel writes anything.

use std::{
    io::ErrorKind,
    os::fd::{FromRawFd, OwnedFd},
};

use linkpilot::kernel::batch::lookup_all;

/// `union bpf_attr`'s map_create head.
#[repr(C)]
#[derive(Default)]
struct CreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

/// `union bpf_attr`'s element members.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> i64 {
    // SAFETY: `attr` is a bpf_attr member of the right layout for `cmd` and outlives the call.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut A, std::mem::size_of::<A>() as u32) }
}

fn create(map_type: u32, key_size: u32, value_size: u32, max_entries: u32) -> OwnedFd {
    let mut attr = CreateAttr { map_type, key_size, value_size, max_entries, map_flags: 0 };
    let fd = bpf(0, &mut attr); // BPF_MAP_CREATE
    assert!(fd >= 0, "BPF_MAP_CREATE: {}", std::io::Error::last_os_error());
    // SAFETY: a new descriptor that nothing else owns.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

const HASH: u32 = 1;
const PERCPU_HASH: u32 = 5;

#[test]
fn a_map_read_with_the_wrong_types_is_an_error_not_a_heap_overflow() {
    use std::os::fd::AsRawFd;
    // 3,000 entries of u32 -> u64: more than a 4,096-slot buffer of 4-byte values can hold.
    let map = create(HASH, 4, 8, 4096);
    for k in 0u32..3000 {
        let v = u64::from(k) * 10;
        let mut attr = ElemAttr {
            map_fd: map.as_raw_fd() as u32,
            _pad: 0,
            key: &raw const k as u64,
            value: &raw const v as u64,
            flags: 0,
        };
        assert_eq!(bpf(2, &mut attr), 0, "BPF_MAP_UPDATE_ELEM"); // BPF_MAP_UPDATE_ELEM
    }
    let mut all = lookup_all::<u32, u64>(&map, 10_000).expect("matching types");
    all.sort_unstable();
    assert_eq!(all.len(), 3000);
    assert!(all.iter().all(|&(k, v)| v == u64::from(k) * 10));
    for e in [
        lookup_all::<u32, u32>(&map, 10_000).map(|_| ()).unwrap_err(),
        lookup_all::<u32, [u64; 4]>(&map, 10_000).map(|_| ()).unwrap_err(),
        lookup_all::<u16, u64>(&map, 10_000).map(|_| ()).unwrap_err(),
    ] {
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("keys of 4 bytes and values of 8 bytes, read as"), "{e}");
    }
    // A per-CPU map holds a value per CPU: refused whatever the types.
    let percpu = create(PERCPU_HASH, 4, 8, 16);
    let e = lookup_all::<u32, u64>(&percpu, 16).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("not a hash or LRU hash map"), "{e}");
}
