//! The NCCL env file (`/run/linkpilot/nccl.env`): the init-time variables a launcher reads
//! when it (re)creates communicators. Replaced atomically (written to a temporary file in the
//! same directory, synced, renamed), so a launcher never reads half a file.

use std::{
    collections::BTreeMap,
    io::{self, Write},
    path::Path,
};

use crate::control::Knobs;

/// Where the daemon writes it.
pub const DEFAULT_PATH: &str = "/run/linkpilot/nccl.env";
/// Where the NCCL tuner plugin is installed (`libnccl-tuner-linkpilot.so`, README).
pub const DEFAULT_TUNER: &str = "/usr/local/lib/linkpilot/libnccl-tuner-linkpilot.so";

/// The tuner plugin the env file names.
#[derive(Clone, Debug)]
pub struct Tuner {
    /// An absolute path (the job's working directory is not the daemon's).
    pub plugin: std::path::PathBuf,
    /// The policy's largest chunk: NCCL_BUFFSIZE, so that every chunk the board may ask for
    /// fits NCCL's buffers (the plugin asks for the live one per collective).
    pub chunk_max: u64,
}

/// The plugin at `path`, made absolute, if it is installed there (`off`: never).
pub fn installed_tuner(path: &Path) -> Option<std::path::PathBuf> {
    if path == Path::new("off") || !path.is_file() {
        return None;
    }
    path.canonicalize().ok()
}

/// The file's text for one link's decision: `KEY=value` lines a shell can source (`set -a; .
/// FILE`) and systemd can read (`EnvironmentFile=`). Without the tuner plugin NCCL_BUFFSIZE is
/// the current chunk (NCCL reads it when a communicator starts); with it, the policy's largest,
/// and NCCL_TUNER_PLUGIN names the plugin. `extra` (the policy's `[env]`, checked: names that
/// are not computed, values a shell keeps as they are) follows, sorted.
pub fn render(
    link: &str,
    state: &str,
    k: &Knobs,
    decision_id: u64,
    tuner: Option<&Tuner>,
    extra: &BTreeMap<String, String>,
) -> String {
    let buffsize = tuner.map_or(k.chunk_bytes, |t| t.chunk_max.max(k.chunk_bytes));
    let mut vars: Vec<(&str, String)> = vec![
        ("NCCL_IB_TIMEOUT", k.nccl_ib_timeout.to_string()),
        ("NCCL_IB_RETRY_CNT", k.nccl_ib_retry_cnt.to_string()),
        ("NCCL_BUFFSIZE", buffsize.to_string()),
        // Without it a timed-out collective hangs instead of failing over to a restart.
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1".to_owned()),
        // For the launcher: init_process_group(timeout=...), seconds.
        ("LINKPILOT_COLLECTIVE_TIMEOUT_S", k.watchdog_s.to_string()),
        ("LINKPILOT_COMPRESSION", k.compression.to_string()),
        ("LINKPILOT_LINK", link.to_owned()),
        ("LINKPILOT_STATE", state.to_owned()),
        ("LINKPILOT_DECISION_ID", decision_id.to_string()),
    ];
    // "keep": the job's own NCCL_IB_TC (or NCCL's default) stays in force.
    if let Some(tc) = k.roce_traffic_class {
        vars.insert(2, ("NCCL_IB_TC", tc.to_string()));
    }
    if let Some(t) = tuner {
        vars.push(("NCCL_TUNER_PLUGIN", t.plugin.display().to_string()));
    }
    let mut out = format!(
        "# Written by linkpilot for link {link} (state {state}, decision {decision_id}).\n\
         # Init-time settings: they take effect when communicators are (re)created.\n"
    );
    for (key, value) in vars {
        out.push_str(&format!("{key}={value}\n"));
    }
    if !extra.is_empty() {
        out.push_str("# The policy's [env].\n");
    }
    for (key, value) in extra {
        out.push_str(&format!("{key}={value}\n"));
    }
    out
}

/// Replaces `path` with `contents` atomically: a fresh temporary file (never a fixed name, which
/// someone could plant a symlink at), synced, then renamed over `path`.
pub fn write_atomic(path: &Path, contents: &str) -> io::Result<()> {
    let mut f = crate::actuate::files::temp_beside(path)?;
    f.write_all(contents.as_bytes())?;
    f.as_file().sync_all()?;
    f.persist(path).map_err(|e| e.error)?;
    Ok(())
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

/// `linkpilot env`: the running daemon's env file, or with a policy the file its first
/// decision would write.
pub fn print(
    file: &std::path::Path,
    policy: Option<&std::path::Path>,
    nccl_tuner: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let Some(policy) = policy else {
        let text = std::fs::read_to_string(file).with_context(|| {
            format!("no env file at {} (is `linkpilot run` running?)", file.display())
        })?;
        print!("{text}");
        return Ok(());
    };
    let policy = crate::control::Policy::load(policy)?;
    let chunk_max = policy.bounds.chunk_max;
    let extra = policy.env.clone();
    let mut core = crate::control::Core::new(policy);
    let start = core.step(&crate::sense::sensors::Snapshot::default());
    let d = start.first().context("the policy has no link")?;
    let tuner = crate::actuate::envfile::installed_tuner(nccl_tuner)
        .map(|plugin| crate::actuate::envfile::Tuner { plugin, chunk_max });
    print!(
        "{}",
        crate::actuate::envfile::render(&d.link, &d.state, &d.knobs, d.id, tuner.as_ref(), &extra)
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::env_names::{is_computed, is_env_name};

    fn knobs() -> Knobs {
        Knobs::recipe()
    }

    fn none() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// Part of the reference case's NCCL environment, as a policy's `[env]` gives it.
    fn recipe() -> BTreeMap<String, String> {
        [("NCCL_PROTO", "Simple"), ("NCCL_ALGO", "Tree"), ("NCCL_IB_HCA", "mlx5_0,mlx5_1")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }

    #[test]
    fn the_policys_env_follows_the_computed_variables_sorted() {
        let text = render("hk-us", "healthy", &knobs(), 7, None, &recipe());
        let keys: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .collect();
        let n = keys.len();
        assert_eq!(keys[n - 3..], ["NCCL_ALGO", "NCCL_IB_HCA", "NCCL_PROTO"], "{text}");
        assert!(keys[..n - 3].iter().all(|k| is_computed(k)), "{keys:?}");
        let vars = parse(&text).unwrap();
        assert_eq!(vars["NCCL_ALGO"], "Tree");
        assert_eq!(vars["NCCL_IB_HCA"], "mlx5_0,mlx5_1");
        assert_eq!(vars["NCCL_IB_TIMEOUT"], "22");
        // Without [env], nothing more than before.
        let plain = render("hk-us", "healthy", &knobs(), 7, None, &none());
        assert!(!plain.contains("[env]") && !plain.contains("NCCL_ALGO"), "{plain}");
    }

    #[test]
    fn a_kept_roce_class_leaves_nccl_ib_tc_to_the_job() {
        let set = parse(&render("l", "s", &knobs(), 1, None, &none())).unwrap();
        assert_eq!(set["NCCL_IB_TC"], "106");
        let k = Knobs { roce_traffic_class: None, ..knobs() };
        let kept = parse(&render("l", "s", &k, 1, None, &none())).unwrap();
        assert!(!kept.contains_key("NCCL_IB_TC"), "{kept:?}");
        assert_eq!(kept.len() + 1, set.len());
    }

    #[test]
    fn computed_names_and_env_names() {
        let plugin = Tuner { plugin: "/x.so".into(), chunk_max: 1 << 20 };
        let text = render("l", "s", &knobs(), 1, Some(&plugin), &none());
        for key in parse(&text).unwrap().keys() {
            assert!(is_computed(key), "{key} is computed but a policy could set it");
        }
        assert!(is_computed("LINKPILOT_ANYTHING") && is_computed("NCCL_ASYNC_ERROR_HANDLING"));
        assert!(!is_computed("NCCL_ALGO"));
        assert!(is_env_name("NCCL_ALGO") && is_env_name("_x1"));
        assert!(!is_env_name("") && !is_env_name("1X") && !is_env_name("NCCL-ALGO"));
        assert!(!is_env_name("A B") && !is_env_name("É"));
    }

    #[test]
    fn the_reference_case_values() {
        let text = render("hk-us", "congested", &knobs(), 42, None, &none());
        let vars = parse(&text).unwrap();
        assert_eq!(vars["NCCL_IB_TIMEOUT"], "22");
        assert_eq!(vars["NCCL_IB_TC"], "106");
        assert_eq!(vars["NCCL_BUFFSIZE"], "8388608");
        assert_eq!(vars["LINKPILOT_COMPRESSION"], "int8");
        assert_eq!(vars["LINKPILOT_COLLECTIVE_TIMEOUT_S"], "1800");
        assert!(parse("NCCL_X\n").unwrap_err().contains("line 1"));
        assert!(!vars.contains_key("NCCL_TUNER_PLUGIN"));
    }

    #[test]
    fn with_the_tuner_plugin_buffsize_covers_the_largest_chunk() {
        let plugin = "/opt/lp/libnccl-tuner-linkpilot.so".into();
        let t = Tuner { plugin, chunk_max: 32 << 20 };
        let vars = parse(&render("hk-us", "congested", &knobs(), 42, Some(&t), &none())).unwrap();
        assert_eq!(vars["NCCL_BUFFSIZE"], "33554432");
        assert_eq!(vars["NCCL_TUNER_PLUGIN"], "/opt/lp/libnccl-tuner-linkpilot.so");
        assert_eq!(installed_tuner(Path::new("off")), None);
        assert_eq!(installed_tuner(Path::new("/nonexistent/lib.so")), None);
        let exe = std::env::current_exe().unwrap();
        assert_eq!(installed_tuner(&exe), Some(exe.canonicalize().unwrap()));
    }

    #[test]
    fn a_shell_sources_it() {
        let dir = std::env::temp_dir().join(format!("lp-env-{}", std::process::id()));
        let path = dir.join("nccl.env");
        write_atomic(&path, &render("hk-us", "healthy", &knobs(), 1, None, &none())).unwrap();
        // Replacing leaves no temporary file behind.
        write_atomic(&path, &render("hk-us", "severe", &knobs(), 2, None, &recipe())).unwrap();
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "set -a; . '{}'; echo $NCCL_IB_TIMEOUT $LINKPILOT_STATE $NCCL_IB_HCA",
                path.display()
            ))
            .output()
            .unwrap();
        let entries = std::fs::read_dir(&dir).unwrap().count();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "22 severe mlx5_0,mlx5_1");
        assert_eq!(entries, 1);
    }
}
