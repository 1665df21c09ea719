//! The shipped Grafana dashboard (deploy/grafana/linkpilot.json) read as Grafana reads it: its
//! panels' PromQL queries, its template variables, and the queries with the variables replaced.

use serde_json::Value;

pub const DASHBOARD: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/linkpilot.json");

pub fn load() -> Value {
    let text = std::fs::read_to_string(DASHBOARD).expect("dashboard");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

/// One query of one panel.
#[derive(Clone, Debug)]
pub struct Query {
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
}

/// Every target's `expr`, in panels and in panels nested in (collapsed) rows.
pub fn queries(dashboard: &Value) -> Vec<Query> {
    let mut out = Vec::new();
    let mut stack: Vec<&Value> =
        dashboard["panels"].as_array().map(|a| a.iter().collect()).unwrap_or_default();
    while let Some(p) = stack.pop() {
        if let Some(nested) = p["panels"].as_array() {
            stack.extend(nested);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push(Query {
                    panel: p["title"].as_str().unwrap_or("?").to_owned(),
                    ref_id: t["refId"].as_str().unwrap_or("?").to_owned(),
                    expr: expr.to_owned(),
                });
            }
        }
    }
    out.sort_by(|a, b| (&a.panel, &a.ref_id).cmp(&(&b.panel, &b.ref_id)));
    out
}

/// A `query` template variable: `label_values(SELECTOR, LABEL)`, and what "All" stands for.
#[derive(Clone, Debug)]
pub struct Variable {
    pub name: String,
    pub selector: String,
    pub label: String,
    pub all_value: Option<String>,
}

pub fn variables(dashboard: &Value) -> Vec<Variable> {
    let mut out = Vec::new();
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().expect("variable name").to_owned();
        let q = v["query"].as_str().unwrap_or_else(|| panic!("variable {name}: no query string"));
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {name}: not label_values(...): {q}"));
        let (selector, label) = inner.rsplit_once(',').expect("label_values(selector, label)");
        let all = v["includeAll"].as_bool().unwrap_or(false);
        out.push(Variable {
            name,
            selector: selector.trim().to_owned(),
            label: label.trim().to_owned(),
            all_value: all.then(|| v["allValue"].as_str().unwrap_or(".*").to_owned()),
        });
    }
    out
}

/// `text` with `$name` and `${name}` replaced, longest names first (so `$__rate_interval` is
/// not read as `$__rate` followed by text).
pub fn substitute(text: &str, values: &[(String, String)]) -> String {
    let mut sorted: Vec<&(String, String)> = values.iter().collect();
    sorted.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
    let mut out = text.to_owned();
    for (name, value) in sorted {
        out = out.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
    }
    out
}

/// Metric names a PromQL expression mentions (words starting with `linkpilot_`).
pub fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("linkpilot_"))
        .map(str::to_owned)
        .collect()
}
