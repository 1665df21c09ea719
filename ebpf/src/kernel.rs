//! What the controller patches in at load time from the running kernel (BTF offsets, the watched
//! network namespace), and reading a socket's namespace, which every tracepoint checks before it
//! counts (`jobs.rs`).

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::TracePointContext, EbpfContext};
use linkpilot_common::KernelOffsets;

/// Fields of a tracepoint's record read straight from the program's context, which the verifier
/// allows as aligned loads of 1, 2, 4 or 8 bytes at constant offsets. aya's `read_at` goes
/// through `bpf_probe_read_kernel`: a helper call per field, most of a tracepoint's cost.
pub(crate) trait Record {
    /// The `T` at `offset` of the record, in loads as wide as its alignment there allows.
    /// Never fails; a `Result` so that it reads like `read_at`.
    ///
    /// # Safety
    /// `offset..offset + size_of::<T>()` lies within the record, and `offset` is a constant
    /// once inlined (the verifier takes no variable context offsets).
    unsafe fn field<T: Copy>(&self, offset: usize) -> Result<T, i32>;
}

impl Record for TracePointContext {
    #[inline(always)]
    unsafe fn field<T: Copy>(&self, offset: usize) -> Result<T, i32> {
        let mut out = core::mem::MaybeUninit::<T>::uninit();
        let dst = out.as_mut_ptr().cast::<u8>();
        let size = core::mem::size_of::<T>();
        // Straight-line loads, each at a constant offset from the context pointer itself: a loop
        // (unrolled or not) walks a pointer derived from the context, which the verifier
        // refuses ("modified ctx ptr"). Volatile: LLVM would merge neighbours into one wider,
        // misaligned load. The record layouts need these sizes and alignments only.
        // SAFETY: within the record (the caller's promise), each load aligned to its size; the
        // stores go to `out`.
        unsafe {
            match (size, offset % 8) {
                (2, _) => copy::<u16>(self, offset, dst, 0),
                (4, 0 | 4) => copy::<u32>(self, offset, dst, 0),
                (4, _) => {
                    copy::<u16>(self, offset, dst, 0);
                    copy::<u16>(self, offset + 2, dst, 2);
                }
                (8, 0) => copy::<u64>(self, offset, dst, 0),
                (16, 0) => {
                    copy::<u64>(self, offset, dst, 0);
                    copy::<u64>(self, offset + 8, dst, 8);
                }
                (16, 4) => {
                    for i in [0, 4, 8, 12] {
                        copy::<u32>(self, offset + i, dst, i);
                    }
                }
                (16, _) => {
                    for i in [0, 2, 4, 6, 8, 10, 12, 14] {
                        copy::<u16>(self, offset + i, dst, i);
                    }
                }
                // No record field of ours has another shape.
                _ => return Err(-22),
            }
        }
        // SAFETY: every byte of `out` was written above; T is plain data (Copy, any bits).
        Ok(unsafe { out.assume_init() })
    }
}

/// One aligned load of a `W` at `offset` of the record, stored at `dst + at`.
///
/// # Safety
/// As [`Record::field`], and `offset` is a multiple of `size_of::<W>()`.
#[inline(always)]
unsafe fn copy<W: Copy>(ctx: &TracePointContext, offset: usize, dst: *mut u8, at: usize) {
    // SAFETY: the caller's promise.
    unsafe {
        let v = ctx.as_ptr().cast::<u8>().add(offset).cast::<W>().read_volatile();
        dst.add(at).cast::<W>().write_unaligned(v);
    }
}

/// Set by the controller at load time.
#[unsafe(no_mangle)]
pub(crate) static LP_KERNEL_OFFSETS: KernelOffsets = KernelOffsets {
    skb_tcp_gso_segs: 0,
    retransmit_has_err: 0,
    sock_net: 0,
    net_inum: 0,
    netns_inum: 0,
    sock_known: 0,
    sock_family: 0,
    sock_num: 0,
    sock_dport: 0,
    sock_rcv_saddr: 0,
    sock_daddr: 0,
    sock_v6_rcv_saddr: 0,
    sock_v6_daddr: 0,
};

/// The watched network namespace's inode number, or None when there is none to check against
/// (none set, or no BTF offsets to read a socket's by): every namespace counts then.
#[inline(always)]
pub(crate) fn watched_netns() -> Option<u32> {
    // SAFETY: a read-only global patched at load time.
    let (want, net_inum) = unsafe {
        (
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.netns_inum),
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.net_inum),
        )
    };
    (want != 0 && net_inum != 0).then_some(want)
}

/// The network namespace (inode number) of socket `sk`, a kernel address; None when the
/// kernel gave no offsets to read it by or a read fails.
#[inline(always)]
pub(crate) fn sock_netns(sk: u64) -> Option<u32> {
    // SAFETY: a read-only global patched at load time.
    let (sock_net, net_inum) = unsafe {
        (
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.sock_net),
            core::ptr::read_volatile(&LP_KERNEL_OFFSETS.net_inum),
        )
    };
    if net_inum == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel tolerates any address and reports failure.
    let net = unsafe { bpf_probe_read_kernel((sk + u64::from(sock_net)) as *const u64) }.ok()?;
    unsafe { bpf_probe_read_kernel((net + u64::from(net_inum)) as *const u32) }.ok()
}
