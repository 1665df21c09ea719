//! The NCCL env file (`/run/linkpilot/nccl.env`): the init-time variables a launcher reads
//! when it (re)creates communicators. Replaced atomically (written to a temporary file in the
//! same directory, synced, renamed), so a launcher never reads half a file.

use std::{
    collections::BTreeMap,
    fs,
    io::{self, Write},
    path::Path,
};

use crate::control::Knobs;

/// Where the daemon writes it.
pub const DEFAULT_PATH: &str = "/run/linkpilot/nccl.env";

/// The file's text for one link's decision: `KEY=value` lines a shell can source (`set -a; .
/// FILE`) and systemd can read (`EnvironmentFile=`).
pub fn render(link: &str, state: &str, k: &Knobs, decision_id: u64) -> String {
    let vars: [(&str, String); 10] = [
        ("NCCL_IB_TIMEOUT", k.nccl_ib_timeout.to_string()),
        ("NCCL_IB_RETRY_CNT", k.nccl_ib_retry_cnt.to_string()),
        ("NCCL_IB_TC", k.roce_traffic_class.to_string()),
        ("NCCL_BUFFSIZE", k.chunk_bytes.to_string()),
        // Without it a timed-out collective hangs instead of failing over to a restart.
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_owned()),
        // For the launcher: init_process_group(timeout=...), seconds.
        ("LINKPILOT_COLLECTIVE_TIMEOUT_S", k.watchdog_s.to_string()),
        ("LINKPILOT_COMPRESSION", k.compression.to_string()),
        ("LINKPILOT_LINK", link.to_owned()),
        ("LINKPILOT_STATE", state.to_owned()),
        ("LINKPILOT_DECISION_ID", decision_id.to_string()),
    ];
    let mut out = format!(
        "# Written by linkpilot for link {link} (state {state}, decision {decision_id}).\n\
         # Init-time settings: they take effect when communicators are (re)created.\n"
    );
    for (key, value) in vars {
        out.push_str(&format!("{key}={value}\n"));
    }
    out
}

/// Replaces `path` with `contents` atomically.
pub fn write_atomic(path: &Path, contents: &str) -> io::Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let tmp = dir
        .join(format!(".{}.tmp", path.file_name().and_then(|n| n.to_str()).unwrap_or("linkpilot")));
    let mut f = fs::File::create(&tmp)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()?;
    fs::rename(&tmp, path)
}

/// `KEY=value` lines of an env file (comments and blank lines skipped); an error names the line
/// that is neither.
pub fn parse(contents: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (i, line) in contents.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .ok_or_else(|| format!("line {}: not KEY=value: {line:?}", i + 1))?;
        out.insert(k.to_owned(), v.to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::Compression;

    fn knobs() -> Knobs {
        Knobs {
            compression: Compression::Int8,
            chunk_bytes: 8 << 20,
            nccl_ib_timeout: 22,
            nccl_ib_retry_cnt: 7,
            watchdog_s: 1800,
            dscp: 26,
            roce_traffic_class: 106,
            tcp_buffer_bytes: 128 << 20,
        }
    }

    #[test]
    fn the_reference_case_values() {
        let text = render("hk-us", "congested", &knobs(), 42);
        let vars = parse(&text).unwrap();
        assert_eq!(vars["NCCL_IB_TIMEOUT"], "22");
        assert_eq!(vars["NCCL_IB_TC"], "106");
        assert_eq!(vars["NCCL_BUFFSIZE"], "8388608");
        assert_eq!(vars["LINKPILOT_COMPRESSION"], "int8");
        assert_eq!(vars["LINKPILOT_COLLECTIVE_TIMEOUT_S"], "1800");
        assert!(parse("NCCL_X\n").unwrap_err().contains("line 1"));
    }

    #[test]
    fn a_shell_sources_it() {
        let dir = std::env::temp_dir().join(format!("lp-env-{}", std::process::id()));
        let path = dir.join("nccl.env");
        write_atomic(&path, &render("hk-us", "healthy", &knobs(), 1)).unwrap();
        // Replacing leaves no temporary file behind.
        write_atomic(&path, &render("hk-us", "severe", &knobs(), 2)).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("set -a; . '{}'; echo $NCCL_IB_TIMEOUT $LINKPILOT_STATE", path.display()))
            .output()
            .unwrap();
        let entries = fs::read_dir(&dir).unwrap().count();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "22 severe");
        assert_eq!(entries, 1);
    }
}
