//! Running iproute2 and friends with failures that name the command.

use std::process::Command;

/// A command that failed.
#[derive(Debug, thiserror::Error)]
#[error("`{command}` failed: {detail}")]
pub struct CommandError {
    pub command: String,
    pub detail: String,
}

/// Runs `args` (program first) and returns stdout.
pub fn run(args: &[&str]) -> Result<String, CommandError> {
    let command = args.join(" ");
    let out = Command::new(args[0]).args(&args[1..]).output().map_err(|e| CommandError {
        command: command.clone(),
        detail: format!("could not start {}: {e}", args[0]),
    })?;
    if !out.status.success() {
        let detail = format!("{}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
        return Err(CommandError { command, detail });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `args` inside network namespace `ns` (`ip netns exec`, which also gives the command a
/// sysfs of that namespace).
pub fn in_ns(ns: &str, args: &[&str]) -> Result<String, CommandError> {
    let mut full = vec!["ip", "netns", "exec", ns];
    full.extend_from_slice(args);
    run(&full)
}

/// Sets sysctl `key` to `value` in namespace `ns`.
pub fn sysctl(ns: &str, key: &str, value: &str) -> Result<(), CommandError> {
    in_ns(ns, &["sysctl", "-qw", &format!("{key}={value}")]).map(drop)
}

/// Runs `args` inside `ns` and returns stdout whatever the exit status (for tools such as ping
/// that exit non-zero when they have something to report).
pub fn in_ns_any_status(ns: &str, args: &[&str]) -> Result<String, CommandError> {
    let command = args.join(" ");
    let out = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .map_err(|e| CommandError { command, detail: format!("could not start ip: {e}") })?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
