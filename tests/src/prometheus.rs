//! A real Prometheus server (Debian's `prometheus`) for one test: its own config, data directory
//! and port, run in a lab host's namespace next to the daemon it scrapes; queried through its
//! HTTP API with curl.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::Duration,
};

use linkpilot_lab::lab::Host;
use serde_json::Value;

use crate::daemon::wait_for;

/// Scrape and rule evaluation interval: short, so a test sees several samples in seconds.
pub const SCRAPE_INTERVAL_S: u64 = 1;

pub struct Prometheus {
    child: Child,
    host: Host,
    pub port: u16,
    pub dir: PathBuf,
}

/// A port nothing listens on in `host`'s namespace, from the kernel (bind to port 0).
fn free_port(host: &Host) -> u16 {
    host.spawn(|| TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()))
        .join()
        .expect("port thread")
        .expect("binding port 0")
        .port()
}

impl Prometheus {
    /// Starts a server in `host` scraping `target` (job "linkpilot") with `rules` loaded; its
    /// config, data and log live in `dir`. Returns once it reports ready.
    pub fn start(host: &Host, dir: &Path, target: &str, rules: &[&Path]) -> Self {
        std::fs::create_dir_all(dir.join("data")).expect("prometheus dir");
        let rule_files: Vec<String> =
            rules.iter().map(|r| format!("  - {}\n", r.display())).collect();
        let config = format!(
            "global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  scrape_timeout: {SCRAPE_INTERVAL_S}s\n  \
             evaluation_interval: {SCRAPE_INTERVAL_S}s\nrule_files:\n{}scrape_configs:\n  \
             - job_name: linkpilot\n    static_configs:\n      - targets: [\"{target}\"]\n",
            rule_files.concat()
        );
        std::fs::write(dir.join("prometheus.yml"), config).expect("prometheus.yml");
        let port = free_port(host);
        let child = host
            .command("prometheus")
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("log")).expect("prometheus log"))
            .spawn()
            .expect("prometheus (Debian package `prometheus`; `cargo xtask setup` installs it)");
        let p = Self { child, host: host.clone(), port, dir: dir.to_owned() };
        wait_for("Prometheus ready", Duration::from_secs(30), || {
            p.host.exec(&["curl", "-sf", &p.url("/-/ready")]).is_ok()
        });
        p
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    /// GET `path` with `params` URL-encoded: the API's `data`, or its error.
    pub fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let mut args = vec!["curl".to_owned(), "-s".into(), "-G".into(), self.url(path)];
        for (k, v) in params {
            args.extend(["--data-urlencode".into(), format!("{k}={v}")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.host.exec(&args).map_err(|e| format!("curl {path}: {e}"))?;
        let v: Value = serde_json::from_str(&out).map_err(|e| format!("{path}: {e}: {out}"))?;
        match v["status"].as_str() {
            Some("success") => Ok(v["data"].clone()),
            _ => Err(format!("{path} {params:?}: {}: {}", v["errorType"], v["error"])),
        }
    }

    /// An instant query's result: the vector's elements (a scalar counts as one).
    pub fn query(&self, q: &str) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/query", &[("query", q)])?;
        match data["resultType"].as_str() {
            Some("vector" | "matrix") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            _ => Ok(vec![data["result"].clone()]),
        }
    }

    /// The one value of a query that must return exactly one series.
    pub fn value(&self, q: &str) -> f64 {
        let r = self.query(q).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(r.len(), 1, "{q}: {r:?}");
        r[0]["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
    }

    /// Values of `label` over the series that match `selector` (Grafana's `label_values`).
    pub fn label_values(&self, selector: &str, label: &str) -> Vec<String> {
        let data = self
            .api(&format!("/api/v1/label/{label}/values"), &[("match[]", selector)])
            .unwrap_or_else(|e| panic!("{e}"));
        let mut v: Vec<String> = data
            .as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
