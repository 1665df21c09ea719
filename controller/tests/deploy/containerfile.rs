//! deploy/Containerfile's stages against each other, read as text: the in-image build and the
//! prebuilt stage ship the same files, from sources that exist (tests/tests/image.rs builds the
//! image for real).

use std::collections::BTreeSet;

use linkpilot::actuate::envfile::DEFAULT_TUNER;

use crate::manifests::*;

/// One stage of deploy/Containerfile (`FROM ... AS name`, or the last one for None), from the
/// line after its FROM.
fn stage(name: Option<&str>) -> String {
    let text = std::fs::read_to_string(repo("deploy/Containerfile")).expect("Containerfile");
    let stages: Vec<&str> = text.split("\nFROM ").skip(1).collect();
    let body = match name {
        Some(s) => stages
            .iter()
            .find(|b| b.lines().next().is_some_and(|l| l.ends_with(&format!(" AS {s}"))))
            .unwrap_or_else(|| panic!("no stage {s}")),
        None => stages.last().expect("a stage"),
    };
    body.split_once('\n').map_or("", |(_, rest)| rest).to_owned()
}

/// The `COPY` lines of a stage, as (sources, destination, --from).
fn copies(stage: &str) -> Vec<(Vec<String>, String, Option<String>)> {
    stage
        .lines()
        .filter_map(|l| l.strip_prefix("COPY "))
        .map(|l| {
            let mut words: Vec<String> = l.split_whitespace().map(str::to_owned).collect();
            let from = words.first().and_then(|w| w.strip_prefix("--from=")).map(str::to_owned);
            if from.is_some() {
                words.remove(0);
            }
            let dest = words.pop().expect("a destination");
            (words, dest, from)
        })
        .collect()
}

/// Where a COPY puts `source`: into `dest` if it names a directory.
fn installed_at(source: &str, dest: &str) -> String {
    if dest.ends_with('/') {
        format!("{dest}{}", split(source).1)
    } else {
        dest.to_owned()
    }
}

#[test]
fn the_containerfiles_stages_ship_the_same_files_from_sources_that_exist() {
    // Built here, or copied from a host build: the same files at the same paths, the tuner
    // plugin where the daemon looks by default.
    let built = copies(&stage(None));
    let prebuilt = copies(&stage(Some("runtime-prebuilt")));
    let paths = |c: &[(Vec<String>, String, Option<String>)]| -> BTreeSet<String> {
        c.iter().flat_map(|(s, d, _)| s.iter().map(|s| installed_at(s, d))).collect()
    };
    assert_eq!(paths(&built), paths(&prebuilt));
    assert!(paths(&built).contains(DEFAULT_TUNER), "{:?}", paths(&built));
    assert!(paths(&built).contains("/usr/local/bin/linkpilot"));
    // The last stage's files come from the build stage, which installs each of them.
    let build = stage(Some("build"));
    for (sources, _, from) in &built {
        assert_eq!(from.as_deref(), Some("build"), "{sources:?}");
        for s in sources {
            assert!(build.contains(&format!(" {s}")), "the build stage never makes {s}");
        }
    }
    // The prebuilt stage's sources are in the context: files a host build makes under target/
    // (which .dockerignore lets through, one by one), or files of the repository.
    let ignore = std::fs::read_to_string(repo(".dockerignore")).expect(".dockerignore");
    for (sources, _, from) in &prebuilt {
        assert!(from.is_none(), "{sources:?} from the context");
        for s in sources {
            if s.starts_with("target/") {
                assert!(ignore.lines().any(|l| l == format!("!{s}")), ".dockerignore drops {s}");
            } else {
                assert!(repo(s).exists(), "{s} does not exist");
            }
        }
    }
    // The zig the build stage fetches is the one `cargo xtask setup` pins.
    let python = std::fs::read_to_string(repo("xtask/src/python.rs")).expect("python.rs");
    let zig = build.split_whitespace().find(|w| w.starts_with("ziglang==")).expect("ziglang pin");
    assert!(python.contains(&format!("\"{zig}\"")), "xtask/src/python.rs pins another {zig}");
}
