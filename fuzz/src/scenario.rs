//! A lab scenario file, as `linkpilot-lab` reads it (chains resolved against the shipped
//! scenarios), then what the delay line does with it: the phase in force at times across the
//! scenario and a few packets through each direction's link model.

use std::path::Path;

use linkpilot_common::units::Nanos;
use linkpilot_lab::{
    model::{EcnCodepoint, Link, Params},
    scenario::{Direction, Scenario},
};
use rand::{rngs::SmallRng, SeedableRng};

pub fn check(data: &[u8]) {
    let Ok(src) = std::str::from_utf8(data) else { return };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/scenarios");
    let Ok(s) = Scenario::parse(src, "fuzz.toml", Some(&dir)) else { return };
    let total = s.duration().0;
    let mut times = vec![0, total / 2, total.saturating_sub(1), total, total.saturating_mul(2)];
    times.extend((0..s.phases.len()).map(|i| s.phase_start(i).0));
    let mut rng = SmallRng::seed_from_u64(1);
    for t in times {
        let (i, phase, progress) = s.phase_at(Nanos(t));
        assert!(i < s.phases.len() && (0.0..=1.0).contains(&progress), "{i} {progress}");
        let in_phase = Nanos(t.saturating_sub(s.phase_start(i).0));
        for dir in [Direction::HkToUs, Direction::UsToHk] {
            let p = Params::of(phase.link(dir), progress, in_phase);
            let mut link = Link::new();
            for k in 0..8u64 {
                let ecn = EcnCodepoint::from_bits(k as u8);
                let _ = link.on_packet(&p, t.saturating_add(k * 100_000), 1500, ecn, &mut rng);
            }
        }
    }
}
