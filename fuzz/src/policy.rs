//! A policy file, as `linkpilot policy check` reads it: parsed and checked whole, errors
//! printed with file:line:column. A policy the check accepts must also start the control core
//! and give an env file that reads back as it was written (what `linkpilot env --policy` does).

use linkpilot::{
    actuate::envfile,
    control::{Core, Policy},
    sense::sensors::Snapshot,
};

pub fn check(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else { return };
    match Policy::parse(src, "fuzz.toml") {
        Err(errors) => {
            assert!(!errors.0.is_empty(), "rejected without an error");
            let _ = errors.to_string();
        }
        Ok(policy) => {
            let extra = policy.env.clone();
            let mut core = Core::new(policy);
            for d in core.step(&Snapshot::default()) {
                let text = envfile::render(&d.link, &d.state, &d.knobs, d.id, None, &extra);
                let vars = envfile::parse(&text).expect("a checked policy's env file reads back");
                for (k, v) in &extra {
                    assert_eq!(vars.get(k), Some(v), "[env] {k} did not read back");
                }
            }
        }
    }
}
