//! The Kubernetes manifests (deploy/k8s, and the training pod of deploy/examples) against the
//! Kubernetes schemas, offline (`kubernetes-validate` from the project's .venv, installed by
//! `cargo xtask setup`), and against what they deploy: the systemd unit's capabilities and stop
//! timeout, the binary's command line, the shipped default policy, every site's policy, one
//! daemon per node, the tuner plugin's path from the image to the training pods; and
//! deploy/Containerfile's stages against each other (tests/tests/image.rs builds it for real).
//!
//! One test binary; each module holds the checks of one thing the manifests must agree with.

#[path = "deploy/containerfile.rs"]
mod containerfile;
#[path = "deploy/manifests.rs"]
mod manifests;
#[path = "deploy/policies.rs"]
mod policies;
#[path = "deploy/schema.rs"]
mod schema;
#[path = "deploy/sites.rs"]
mod sites;
#[path = "deploy/tuner.rs"]
mod tuner;
#[path = "deploy/unit.rs"]
mod unit;
