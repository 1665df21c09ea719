//! The classic Prometheus text format (0.0.4), for scrapers that do not ask for OpenMetrics:
//! curl, `promtool check metrics`, older agents. Prometheus itself asks for OpenMetrics.
//!
//! The two differ where this registry's output needs it: a counter family is named with its
//! `_total` suffix in HELP and TYPE (OpenMetrics names it without, and its samples with), and
//! there is no `# EOF` or `# UNIT` line.

use std::collections::HashSet;

pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Whether a request's Accept header asks for OpenMetrics (Prometheus's does, first).
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.contains("application/openmetrics-text"))
}

/// `openmetrics` (as `prometheus_client` encodes it) in the classic text format.
pub fn classic(openmetrics: &str) -> String {
    let counters: HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta =
            ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let tail = if tail == "unknown" { "untyped" } else { tail };
                let suffix = if counters.contains(name) { "_total" } else { "" };
                out.push_str(&format!("{prefix}{name}{suffix} {tail}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_total_name_and_eof_goes() {
        let om = "# HELP lp_ticks Control ticks run.\n# TYPE lp_ticks counter\nlp_ticks_total 3\n\
                  # HELP lp_up Up.\n# TYPE lp_up gauge\nlp_up 1\n# EOF\n";
        assert_eq!(
            classic(om),
            "# HELP lp_ticks_total Control ticks run.\n# TYPE lp_ticks_total counter\n\
             lp_ticks_total 3\n# HELP lp_up Up.\n# TYPE lp_up gauge\nlp_up 1\n"
        );
    }

    #[test]
    fn prometheus_gets_openmetrics_and_curl_the_classic_format() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                          version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        assert!(wants_openmetrics(Some(prometheus)));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }
}
