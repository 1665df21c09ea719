//! Unit tests of the scenario format: parse, validation, error positions.

use super::*;

fn err(src: &str) -> String {
    Scenario::parse(src, "bad.toml", None).unwrap_err().to_string()
}

/// Asserts that `src` is refused with a message that starts with `prefix`.
#[track_caller]
fn assert_err_starts(src: &str, prefix: &str) {
    let e = err(src);
    assert!(e.starts_with(prefix), "{e}");
}

/// Found by the `scenario` fuzz target: a multi-byte character just before the key of a
/// bad value cut the source inside that character (a panic instead of the error).
#[test]
fn a_multibyte_character_before_a_bad_value_is_an_error() {
    assert_err_starts("[[phase]]\nn\u{feff}ame =  = ]a\n", "bad.toml:2:10: field `ame`: extra `=`");
    assert_err_starts(
        "[[phase]]\nname = \"x\"\nduration = \"1s\"\n\u{e9}delay = \"9 parsecs\"\n",
        "bad.toml:",
    );
}

#[test]
fn builtins_parse() {
    for (name, _) in BUILTIN {
        let s = Scenario::load(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(!s.phases.is_empty(), "{name}");
    }
    let day = Scenario::load("hk-us-day").unwrap();
    assert!(day.phases.len() >= 5, "hk-us-day chains the others");
}

#[test]
fn errors_name_line_and_column() {
    let src = "name = \"x\"\n[[phase]]\nname = \"a\"\nduration = \"10s\"\n[phase.link]\ndelay = \"90 parsecs\"\n";
    assert_err_starts(src, "bad.toml:6:9: field `delay`: invalid duration \"90 parsecs\"");
    assert_err_starts(
        "name = \"x\"\n[[phase]]\nname = \"a\"\nduration = \"10s\"\ncolour = 1\n",
        "bad.toml:5:1: unknown field `colour`",
    );
    assert_err_starts(
        "name = \"x\"\n[[phase]]\nname = \"a\"\nduration = \"0s\"\n",
        "bad.toml:4:12: phase \"a\": duration must be above zero",
    );
    let red = "name = \"x\"\n[[phase]]\nname = \"a\"\nduration = \"1s\"\n[phase.link]\nrate = \"1Mbit/s\"\necn = { mode = \"red\", min = \"9ms\", max = \"5ms\", max_p = \"10%\" }\n";
    assert_err_starts(red, "bad.toml:7:7: phase \"a\": RED needs min < max");
    let step = "name = \"x\"\n[[phase]]\nname = \"a\"\nduration = \"1s\"\n[phase.link]\nrate = \"1Mbit/s\"\necn = { mode = \"step\", threshold = \"5 furlongs\" }\n";
    assert_err_starts(step, "bad.toml:7:7: field `ecn`: invalid queue level \"5 furlongs\"");
    let e = err("name = \"x\"\n");
    assert!(e.contains("no phases"), "{e}");
    assert_err_starts(
        "name = \"x\"\nchain = [\"nope\"]\n",
        "bad.toml:2:9: chained scenario \"nope\"",
    );
}

#[test]
fn ramps_and_phase_lookup() {
    let src = "name = \"r\"\n[[phase]]\nname = \"a\"\nduration = \"10s\"\n[phase.link]\ndelay = { from = \"10ms\", to = \"30ms\" }\n\
               [[phase]]\nname = \"b\"\nduration = \"5s\"\n[phase.us_to_hk]\ndown = true\n";
    let s = Scenario::parse(src, "r.toml", None).unwrap();
    let (i, p, progress) = s.phase_at(Nanos(5_000_000_000));
    assert_eq!((i, p.name.as_str()), (0, "a"));
    assert_eq!(p.hk_to_us.delay.at(progress), Nanos(20_000_000));
    let (i, p, _) = s.phase_at(Nanos(12_000_000_000));
    assert_eq!(i, 1);
    assert!(p.us_to_hk.down && !p.hk_to_us.down);
    assert_eq!(s.phase_at(Nanos(99_000_000_000)).0, 1, "the last phase goes on");
    assert_eq!(s.phase_start(1), Nanos(10_000_000_000));
}
