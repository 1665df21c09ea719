//! The tests' policies: built from parts by the controller's builder.

pub use linkpilot::control::policy::builder::{PolicyToml, PLAIN};
