//! Types and constants shared by linkpilot's eBPF programs and its controller.
//!
//! Every map key and value is `#[repr(C)]`, `Copy`, and free of implicit padding, so the two sides
//! agree on the bytes. `aya::Pod` impls live behind the `user` feature; the `std` feature adds
//! host-side helpers (configuration units, and where a configuration file is wrong).
#![cfg_attr(not(feature = "std"), no_std)]

pub mod board;
#[cfg(feature = "std")]
pub mod config_error;
pub mod fixed;
pub mod maps;
pub mod packet;
pub mod records;
pub mod transport;
pub mod tuner;
#[cfg(feature = "std")]
pub mod units;

pub use maps::*;
pub use records::*;
