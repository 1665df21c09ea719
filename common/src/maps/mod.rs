//! Map names, program names and the map value types of the kernel/userspace ABI, one file per
//! family of maps. Everything is re-exported here and at the crate root, so callers name
//! `linkpilot_common::X` whichever file holds it; the layout pins and `aya::Pod` impls stay
//! here, in one list, because together they are the promise that both sides agree on the bytes.

/// Adds the named counter fields of `$other` to those of `$sum`, wrapping as the kernel's own
/// counters do: how the controller sums the per-CPU copies of a map value.
macro_rules! add_wrapping {
    ($sum:ident, $other:ident; $($field:ident),+ $(,)?) => {
        $($sum.$field = $sum.$field.wrapping_add($other.$field);)+
    };
}

/// Adds a counter array element by element, wrapping: `add_wrapping!` for the array fields.
fn add_each<const N: usize>(sum: &mut [u64; N], other: &[u64; N]) {
    for (a, b) in sum.iter_mut().zip(other) {
        *a = a.wrapping_add(*b);
    }
}

mod addr;
mod dscp;
mod flows;
mod iface;
mod kernel;
mod losses;
mod peer_stats;
mod peers;
mod programs;

pub use addr::*;
pub use dscp::*;
pub use flows::*;
pub use iface::*;
pub use kernel::*;
pub use losses::*;
pub use peer_stats::*;
pub use peers::*;
pub use programs::*;

const _: () = assert!(core::mem::size_of::<IfaceStats>() == 72);
const _: () = assert!(core::mem::size_of::<DscpRule>() == 20);
const _: () = assert!(core::mem::size_of::<PeerPrefix>() == 20);
const _: () = assert!(core::mem::size_of::<DirCounters>() == 72);
const _: () = assert!(core::mem::size_of::<RoceCounters>() == 16 * 8);
const _: () = assert!(core::mem::size_of::<QpKey>() == 28);
const _: () = assert!(core::mem::size_of::<PeerStats>() == 2 * 72 + 2 * 128 + 32 + 8 + 32 + 64 * 8);
const _: () = assert!(core::mem::size_of::<FlowKey>() == 40);
const _: () = assert!(core::mem::size_of::<FlowState>() == 88);
const _: () = assert!(core::mem::size_of::<IfaceConfig>() == 16);
const _: () = assert!(core::mem::size_of::<LocalAddr>() == 20);
const _: () = assert!(core::mem::size_of::<KernelOffsets>() == 52);
const _: () = assert!(core::mem::size_of::<PeerCacheEntry>() == 24);
const _: () = assert!(core::mem::size_of::<DatapathLosses>() == 6 * 8);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are #[repr(C)], Copy, made only of integers, with no implicit padding (the size
    // assertions above pin their layouts), so every bit pattern is a valid value.
    unsafe impl aya::Pod for super::IfaceStats {}
    unsafe impl aya::Pod for super::IfaceConfig {}
    unsafe impl aya::Pod for super::LocalAddr {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::DscpRule {}
    unsafe impl aya::Pod for super::QpKey {}
    unsafe impl aya::Pod for super::FlowKey {}
    unsafe impl aya::Pod for super::FlowState {}
    unsafe impl aya::Pod for super::PeerPrefix {}
    unsafe impl aya::Pod for super::PeerStats {}
    unsafe impl aya::Pod for super::DatapathLosses {}
}
