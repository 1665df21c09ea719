//! `compression = "auto"`: the choice on its own, the jobs' window, and the core running a
//! simulated job whose wait follows the link as the model says (or slower than measured).

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::control::{
    decide::{Core, Decision},
    tests::snap,
};

/// One link, one state with "auto" (bounds none..int4, 25% margin, one RTT of latency).
fn policy(bounds: &str, outcome: &str) -> Policy {
    let src = format!(
        "[estimator]\newma_half_life = \"100ms\"\n\
         [hysteresis]\nenter_after = \"300ms\"\nexit_after = \"2s\"\nmin_dwell = \"1s\"\n\
         [bounds]\n{bounds}\n\
         [[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"10Gbit/s\"\n\
         [[link.peer]]\nname = \"us\"\ncidrs = [\"198.18.2.0/24\"]\n\
         [[state]]\nname = \"healthy\"\n[state.knobs]\ncompression = \"auto\"\n\
         {outcome}"
    );
    Policy::parse(&src, "test").unwrap_or_else(|e| panic!("{e}"))
}

/// A window holding `steps` steps of `compute_s`, waiting `wait_s`, sending `payload` bytes
/// (before compression) a step with `codec`.
fn window(compute_s: f64, wait_s: f64, payload: f64, codec: Compression) -> JobWindow {
    let mut w = JobWindow::default();
    for i in 0..=10u64 {
        let job = JobProgress {
            job: "lm".into(),
            link: "wan".into(),
            rank_steps: i,
            step_seconds: i as f64 * (compute_s + wait_s),
            codec: codec.to_string(),
            kind: "ddp".into(),
            compute_seconds: i as f64 * compute_s,
            wire_bytes: (i as f64 * payload * codec.ratio()) as u64,
            processes: 1,
        };
        w.read(Duration::from_secs(i), &[job], Duration::from_secs(30));
    }
    w
}

fn chosen(p: &Policy, w: &mut JobWindow, gbit: f64, current: Compression) -> Compression {
    choose(p, w, gbit * 1e9, 180.0, current).expect("a choice").prediction.codec
}

/// Each (Gbit/s, codec in force) chooses the codec given, in turn, on the same window.
fn choices(p: &Policy, w: &mut JobWindow, cases: &[(f64, Compression, Compression)]) {
    for &(gbit, current, want) in cases {
        assert_eq!(chosen(p, w, gbit, current), want, "{gbit} Gbit/s, {current} in force");
    }
}

#[test]
fn the_least_compression_whose_exchange_fits_the_compute() {
    let p = policy("", "");
    // 100 MB of gradients a step, 1 s of compute, 180 ms RTT.
    let at = |gbit: f64| {
        chosen(&p, &mut window(1.0, 0.0, 1e8, Compression::Int4), gbit, Compression::Int4)
    };
    // 10 Gbit/s: uncompressed takes 0.26 s.
    assert_eq!(at(10.0), Compression::None);
    // 1.2 Gbit/s: none takes 0.85 s (1.07 with the margin), fp16 0.51 s.
    assert_eq!(at(1.2), Compression::Fp16);
    // 0.5 Gbit/s: fp16 0.98 s, int8 0.58 s (0.73 with the margin).
    assert_eq!(at(0.5), Compression::Int8);
    // 0.3 Gbit/s: int8 0.85 s (1.07), int4 0.51 s.
    assert_eq!(at(0.3), Compression::Int4);
    // Nothing fits: the strongest.
    assert_eq!(at(0.01), Compression::Int4);
}

#[test]
fn the_prediction_names_its_inputs_and_every_alternative() {
    let p = policy("", "");
    let c =
        choose(&p, &mut window(1.0, 0.0, 1e8, Compression::Int8), 0.5e9, 180.0, Compression::Int8)
            .unwrap();
    let pr = &c.prediction;
    assert_eq!(pr.codec, Compression::Int8);
    assert!((pr.exchange_s - (0.18 + 1e8 * 0.25 * 8.0 / 0.5e9)).abs() < 1e-9, "{pr:?}");
    assert_eq!((pr.wait_s, pr.compute_s, pr.hidden_s), (0.0, 1.0, 1.0));
    assert!((pr.payload_bytes - 1e8).abs() < 1.0, "{pr:?}");
    assert!(c.why.starts_with("compression: auto: int8 exchanges 25.0 MB in 0.580s"), "{}", c.why);
    for other in ["none 1.780s", "fp16 0.980s", "int4 0.380s"] {
        assert!(c.why.contains(other), "{other}: {}", c.why);
    }
}

#[test]
fn bounds_limit_the_choice() {
    use Compression as C;
    let p = policy("compression = { weakest = \"int8\", strongest = \"int8\" }", "");
    let mut w = window(1.0, 0.0, 1e8, C::Int8);
    choices(&p, &mut w, &[(100.0, C::Int8, C::Int8), (0.001, C::Int8, C::Int8)]);
    let p = policy("compression = { weakest = \"fp16\", strongest = \"int8\" }", "");
    choices(&p, &mut w, &[(100.0, C::Int8, C::Fp16), (0.001, C::Int8, C::Int8)]);
}

#[test]
fn a_weaker_codec_needs_room_for_twice_the_margin() {
    use Compression as C;
    let p = policy("", "");
    let mut w = window(1.0, 0.0, 1e8, C::Int4);
    let cases = [
        // 0.36 Gbit/s: int8 takes 0.74 s, 0.92 with the margin (fits 1 s) and 1.10 with twice it.
        (0.36, C::Int4, C::Int4),
        (0.36, C::None, C::Int8),
        // 0.8 Gbit/s: fp16 fits with the margin (0.68 s, 0.85) but not twice it; int8 (0.43 s,
        // 0.64) does: from int4 to int8.
        (0.8, C::Int4, C::Int8),
    ];
    choices(&p, &mut w, &cases);
}

#[test]
fn steps_to_loss_weighs_a_codec_that_needs_more_steps() {
    use Compression as C;
    let outcome = "[outcome]\nsteps_to_loss = { topk = 2.7 }";
    let p = policy("compression = { strongest = \"topk:1%\" }", outcome);
    let mut w = window(1.0, 0.0, 1e8, C::Int4);
    let cases = [
        // Nothing but top-k fits at 0.1 Gbit/s (int4: 1.18 s), yet int4's step (1.48 s with the
        // margin) beats top-k's 2.7 steps.
        (0.1, C::Int4, C::Int4),
        // At 0.01 Gbit/s int4 takes 10.2 s a step, top-k 1.8 s: 4.9 s of steps to its loss.
        (0.01, C::Int4, C::TopK(0.01)),
    ];
    choices(&p, &mut w, &cases);
}

#[test]
fn a_job_that_waits_teaches_the_model_what_compute_hides() {
    let p = policy("", "");
    // At 0.5 Gbit/s int8 takes 0.58 s, hidden by 1 s of compute in the model; the job waited
    // 0.6 s a step (its one bucket goes after the backward pass): compute hides none of it.
    let mut w = window(1.0, 0.6, 1e8, Compression::Int8);
    let c = choose(&p, &mut w, 0.5e9, 180.0, Compression::Int8).unwrap();
    assert_eq!(c.prediction.hidden_s, 0.0, "{:?}", c.prediction);
    assert_eq!(c.prediction.codec, Compression::Int4, "{}", c.why);
    assert!((c.prediction.wait_s - 0.38).abs() < 1e-9, "{:?}", c.prediction);
    assert!(c.why.contains("(as the jobs' waits showed)"), "{}", c.why);
    // At int4 the job no longer waits: compute hid at least int4's 0.38 s, not int8's 0.58 s
    // with the margin, so int8 is not tried again.
    let mut after = window(1.0, 0.0, 1e8, Compression::Int4);
    after.hidden = w.hidden;
    let c = choose(&p, &mut after, 0.5e9, 180.0, Compression::Int4).unwrap();
    assert!((c.prediction.hidden_s - 0.38).abs() < 1e-9, "{:?}", c.prediction);
    assert_eq!(c.prediction.codec, Compression::Int4);
}

#[test]
fn the_window_reads_per_step_jobs_and_restarts_with_their_codec() {
    let w = window(0.5, 0.1, 4e7, Compression::Int8);
    let l = w.load(None).expect("a load");
    assert_eq!((l.codec, l.steps), (Compression::Int8, 10));
    assert!((l.compute_s - 0.5).abs() < 1e-9 && (l.wait_s - 0.1).abs() < 1e-9, "{l:?}");
    assert!((l.payload_bytes - 4e7).abs() < 10.0, "{l:?}");
    // Only steps since a time, and none once the codec changed.
    assert_eq!(w.load(Some(Duration::from_secs(6))).map(|l| l.steps), Some(4));
    assert_eq!(w.load(Some(Duration::from_secs(8))), None, "2 steps are too few");
    let mut w = w;
    let job = |steps: u64, codec: &str, kind: &str| JobProgress {
        job: "lm".into(),
        link: "wan".into(),
        rank_steps: steps,
        step_seconds: steps as f64,
        codec: codec.into(),
        kind: kind.into(),
        compute_seconds: steps as f64 * 0.9,
        wire_bytes: steps * 1000,
        processes: 2,
    };
    w.read(Duration::from_secs(11), &[job(11, "int4", "ddp")], Duration::from_secs(30));
    assert!(w.load(None).is_none(), "a window across two codecs");
    for i in 12..16 {
        w.read(Duration::from_secs(i), &[job(i, "topk:0.01", "ddp")], Duration::from_secs(30));
    }
    let l = w.load(None).expect("the hook's spelling of top-k");
    assert_eq!(l.codec, Compression::TopK(0.01));
    // Two processes on the host: twice the bytes of one rank-step.
    assert!((l.payload_bytes - 2.0 * 1000.0 / 0.02).abs() < 1e-6, "{l:?}");
    // Jobs that synchronize every H steps are not the per-step exchange's.
    let mut outer = JobWindow::default();
    for i in 0..10 {
        outer.read(Duration::from_secs(i), &[job(i, "int8", "outer")], Duration::from_secs(30));
    }
    assert!(outer.load(None).is_none());
}

#[test]
fn the_window_slides() {
    let mut w = window(0.5, 0.0, 4e7, Compression::Int8);
    assert_eq!(w.load(None).map(|l| l.steps), Some(10));
    let job = JobProgress {
        job: "lm".into(),
        link: "wan".into(),
        rank_steps: 50,
        step_seconds: 25.0,
        codec: "int8".into(),
        kind: "ddp".into(),
        compute_seconds: 25.0,
        wire_bytes: (50.0 * 4e7 * 0.25) as u64,
        processes: 1,
    };
    w.read(Duration::from_secs(100), &[job], Duration::from_secs(30));
    // The oldest reading within the window stays as the first: 40 steps since step 10.
    assert_eq!(w.load(None).map(|l| l.steps), Some(40));
    assert_eq!(w.load(Some(Duration::from_secs(50))), None);
}

/// The core with an "auto" policy, a job of 40 MB gradients and 0.6 s of compute a step
/// on a link measured at 500 Mbit/s (RTT 180 ms) whose real rate is `real_bps`; its wait is
/// what the codec in force's exchange leaves over its compute. Reports once a second.
fn run_job(real_bps: f64, seconds: u64) -> (Vec<Decision>, Vec<Check>, Core) {
    let mut core = Core::new(policy("", ""));
    let (payload, compute) = (4e7, 0.6);
    let (mut steps, mut step_s, mut compute_s, mut wire, mut partial) = (0u64, 0.0, 0.0, 0.0, 0.0);
    let mut decisions = Vec::new();
    let mut checks = Vec::new();
    for t in 0..seconds * 10 {
        let codec = core.current().first().map_or(Compression::Int4, |c| c.2.compression);
        let exchange = 0.18 + payload * codec.ratio() * 8.0 / real_bps;
        let step = compute + (exchange - compute).max(0.0);
        partial += 0.1 / step;
        while partial >= 1.0 {
            partial -= 1.0;
            steps += 1;
            step_s += step;
            compute_s += compute;
            wire += payload * codec.ratio();
        }
        let mut s = snap(t * 100, 180.0, 185.0, 0.0, 0.0);
        if t % 10 == 0 {
            s.jobs = Some(vec![JobProgress {
                job: "lm".into(),
                link: "wan".into(),
                rank_steps: steps,
                step_seconds: step_s,
                codec: codec.to_string(),
                kind: "ddp".into(),
                compute_seconds: compute_s,
                wire_bytes: wire as u64,
                processes: 1,
            }]);
        }
        decisions.extend(core.step(&s));
        checks.extend(core.take_codec_checks());
    }
    (decisions, checks, core)
}

#[test]
fn the_core_chooses_predicts_and_judges() {
    // Measured and real 500 Mbit/s: int8's 10 MB take 0.34 s, hidden by 0.6 s of compute
    // with twice the margin (0.51 s); fp16's 0.5 s are not, even with the margin once.
    let (ds, checks, core) = run_job(5e8, 40);
    // Starts at the strongest with nothing known, then int8 with its prediction; other knobs'
    // decisions carry none.
    let codecs = codec_decisions(&ds);
    assert_eq!(
        codecs.iter().map(|d| d.knobs.compression).collect::<Vec<_>>(),
        [Compression::Int4, Compression::Int8]
    );
    assert!(ds.iter().all(|d| d.prediction.is_some() == (d.id == codecs[1].id)), "{ds:#?}");
    let d = codecs[1];
    assert!(d.reason.contains("compression: auto: int8"), "{}", d.reason);
    assert_eq!(d.changes, ["compression int4 -> int8"]);
    let p = d.prediction.as_ref().unwrap();
    assert!((p.exchange_s - 0.34).abs() < 0.01 && p.wait_s == 0.0, "{p:?}");
    assert_eq!(checks.len(), 1, "{checks:?}");
    assert_eq!(checks[0].verdict, "as_predicted", "{checks:?}");
    assert_eq!(checks[0].measured_wait_s, Some(0.0));
    assert_eq!(core.codec_checks(), checks);
}

#[test]
fn a_slower_link_than_measured_shows_as_a_misprediction_and_is_corrected() {
    // The link carries 125 Mbit/s while 500 are measured: int8 takes 0.82 s, the job waits
    // 0.22 s a step where none was predicted.
    let (ds, checks, _) = run_job(1.25e8, 60);
    assert_eq!(checks.first().map(|c| c.verdict.as_str()), Some("mispredicted"), "{checks:?}");
    let w = checks[0].measured_wait_s.unwrap();
    assert!((w - 0.22).abs() < 0.02, "{checks:?}");
    // Corrected: back to int4, which the job's own wait says fits; and it stays there.
    let codecs: Vec<&Decision> = codec_decisions(&ds);
    let seq: Vec<Compression> = codecs.iter().map(|d| d.knobs.compression).collect();
    assert_eq!(
        seq,
        [Compression::Int4, Compression::Int8, Compression::Int4],
        "no swapping back and forth"
    );
    let last = codecs[2];
    assert!(last.reason.contains("(as the jobs' waits showed)"), "{}", last.reason);
}

#[test]
fn a_fixed_codec_is_left_alone_and_predicts_nothing() {
    let src: &str = &crate::control::tests::POLICY;
    let mut core = Core::new(Policy::parse(src, "test").unwrap());
    let mut s = snap(0, 180.0, 185.0, 0.0, 0.0);
    s.jobs =
        Some(vec![JobProgress { kind: "ddp".into(), rank_steps: 0, ..JobProgress::default() }]);
    let ds = core.step(&s);
    assert_eq!(ds[0].knobs.compression, Compression::None);
    assert!(ds[0].prediction.is_none());
    assert!(core.codec_checks().is_empty());
}

/// The first decision and those that changed the codec.
fn codec_decisions(ds: &[Decision]) -> Vec<&Decision> {
    ds.iter()
        .filter(|d| d.changes.is_empty() || d.changes.iter().any(|c| c.starts_with("compression")))
        .collect()
}

fn any_codec() -> impl Strategy<Value = Compression> {
    prop_oneof![
        Just(Compression::None),
        Just(Compression::Fp16),
        Just(Compression::Bf16),
        Just(Compression::Int8),
        Just(Compression::Int4),
        (0.001f64..0.4).prop_map(Compression::TopK),
    ]
}

proptest! {
    /// Whatever the load and the link, a choice lies within the bounds and its prediction is a
    /// finite, non-negative time.
    #[test]
    fn choices_stay_within_bounds(
        a in any_codec(), b in any_codec(), current in any_codec(), running in any_codec(),
        compute in 0.001f64..100.0, wait in 0.0f64..100.0, payload in 0.0f64..1e11,
        gbit in 1e-4f64..400.0, rtt in 0.0f64..2000.0, margin in 0.0f64..3.0,
    ) {
        let (weak, strong) = if a.ratio() >= b.ratio() { (a, b) } else { (b, a) };
        let p = policy(
            &format!("compression = {{ weakest = \"{weak}\", strongest = \"{strong}\", margin = \"{}%\" }}", margin * 100.0),
            "",
        );
        let mut w = window(compute, wait, payload, running);
        if let Some(c) = choose(&p, &mut w, gbit * 1e9, rtt, current) {
            let r = c.prediction.codec.ratio();
            prop_assert!(r <= weak.ratio() + 1e-12 && r >= strong.ratio() - 1e-12, "{c:?}");
            prop_assert!(c.prediction.exchange_s.is_finite() && c.prediction.exchange_s >= 0.0);
            prop_assert!(c.prediction.wait_s >= 0.0 && c.prediction.hidden_s >= 0.0);
            prop_assert!(c.prediction.hidden_s <= compute * (1.0 + 1e-9));
        }
    }
}

#[test]
fn an_auto_outer_codec_is_left_to_the_training_side_within_the_bounds() {
    let src = "[estimator]\newma_half_life = \"100ms\"\n\
               [bounds]\ncompression = { weakest = \"fp16\", strongest = \"int8\" }\n\
               sync_every = { min = 8, max = 200 }\n\
               [[link]]\nname = \"wan\"\ninterfaces = [\"eth0\"]\ncapacity = \"1Gbit/s\"\n\
               [[link.peer]]\nname = \"us\"\ncidrs = [\"198.18.2.0/24\"]\n\
               [[state]]\nname = \"healthy\"\n[state.knobs]\nsync_every = \"auto\"\n\
               outer_codec = \"auto\"\nfragments = 4\n\
               [[state]]\nname = \"worse\"\nenter = { ce_fraction = \"1%\" }\n[state.knobs]\n\
               sync_every = \"auto\"\nouter_codec = \"int4\"\nfragments = 4\n";
    let p = Policy::parse(src, "p.toml").unwrap_or_else(|e| panic!("{e}"));
    let mut core = Core::new(p);
    let ds = core.step(&snap(0, 180.0, 185.0, 0.0, 0.0));
    let y = ds[0].knobs.sync;
    // The strongest it may choose goes where a reader without "auto" looks.
    assert_eq!((y.outer_codec_auto, y.outer_compression), (true, Compression::Int8));
    assert_eq!(y.outer_codec(), "auto (at most int8)");
    let mut worse = Vec::new();
    for t in 1..100 {
        worse.extend(core.step(&snap(t * 100, 180.0, 185.0, 0.05, 0.0)));
    }
    let d = worse.iter().find(|d| d.state == "worse").unwrap_or_else(|| panic!("{worse:#?}"));
    assert!(d.changes.contains(&"outer_codec auto (at most int8) -> int4".to_owned()), "{d:?}");
    assert!(!d.knobs.sync.outer_codec_auto);
}
