//! Benchmarks of the datapath (`programs`: ns per packet of each classifier) and the sensors
//! (`sensors`: a tick's cost and memory with a full flow table).

pub mod programs;
pub mod sensors;
