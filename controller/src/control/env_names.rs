//! The environment variables the env file computes from a decision, and the names a policy's
//! `[env]` may use: the policy's check refuses the first and anything not a variable name, the
//! env file (`actuate::envfile`) writes them.

/// The variables the env file (`actuate::envfile::render`) computes from a decision (and LINKPILOT_*, linkpilot's own names):
/// a policy's `[env]` may not set them.
const COMPUTED: [&str; 6] = [
    "NCCL_IB_TIMEOUT",
    "NCCL_IB_RETRY_CNT",
    "NCCL_IB_TC",
    "NCCL_BUFFSIZE",
    "NCCL_TUNER_PLUGIN",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
];

/// Whether `name` is one the env file computes (a policy's `[env]` may not set it). The old name
/// of TORCH_NCCL_ASYNC_ERROR_HANDLING, NCCL_ASYNC_ERROR_HANDLING, counts too: PyTorch reads
/// either, and a second value would contradict the computed one.
pub fn is_computed(name: &str) -> bool {
    COMPUTED.contains(&name)
        || name == "NCCL_ASYNC_ERROR_HANDLING"
        || name.starts_with("LINKPILOT_")
}

/// Whether `name` is an environment variable name: a letter or '_', then letters, digits, '_'.
pub fn is_env_name(name: &str) -> bool {
    let mut b = name.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}
