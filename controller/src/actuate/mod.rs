//! What decisions change on the host, each reversible: TCP buffer and host sysctls (`sysctl`),
//! the RDMA ports' RoCE traffic class (`roce_tc`), the NCCL env file (`envfile`); the originals
//! of the first two kept crash-safe (`crash_state`); files written as root without following
//! planted links (`files`). The daemon's `actuate` module drives them per tick.

pub(crate) mod crash_state;
pub mod envfile;
pub(crate) mod files;
pub mod roce_tc;
pub mod sysctl;
