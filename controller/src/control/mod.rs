//! The pure control core: policy files, the link estimator, and the decisions (state and knob
//! values, each with its reason) that snapshots lead to. No IO beyond reading a policy file, no
//! aya, no clock: time comes with the snapshots, so replays are exact.

mod auto;
pub mod codec;
pub mod decide;
pub mod env_names;
pub mod estimator;
pub mod knobs;
pub mod outcome;
pub mod plan;
pub mod policy;
pub mod probe;
pub mod replay;
pub mod transport;

pub use decide::{Core, Decision};
pub use knobs::{Compression, Knobs, SyncKnobs};
pub use plan::{LinkPlan, Plan};
pub use policy::{Policy, PolicyError, PolicyErrors};

#[cfg(test)]
mod outcome_tests;
#[cfg(test)]
mod tests;
