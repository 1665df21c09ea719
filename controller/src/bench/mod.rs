//! Benchmarks of the datapath (`programs`: ns per packet of each classifier), the sensors
//! (`sensors`: a tick's cost and memory with a full flow table) and the control core (`core`:
//! a tick for many links and peers).

pub mod core;
pub mod programs;
pub mod sensors;
