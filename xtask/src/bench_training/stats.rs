//! The statistics the benchmark reports: a figure over repeats as its median and range, ratios
//! of two such figures with their spread and a verdict that claims "faster" only where the
//! ranges do not overlap, and the eval-loss curve made monotone before a target is looked up.

use serde_json::{json, Value};

/// A figure measured once per repeat: its median, smallest and largest value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Spread {
    /// Over the finite values; `None` when there are none.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Self { median, min: v[0], max: v[n - 1], n })
    }

    pub fn json(&self) -> Value {
        json!({ "median": self.median, "min": self.min, "max": self.max, "n": self.n })
    }

    /// Read back from [`Spread::json`].
    pub fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            median: v["median"].as_f64()?,
            min: v["min"].as_f64()?,
            max: v["max"].as_f64()?,
            n: v["n"].as_u64()? as usize,
        })
    }

    /// Every value scaled by `k` (> 0).
    pub fn scaled(&self, k: f64) -> Self {
        Self { median: self.median * k, min: self.min * k, max: self.max * k, n: self.n }
    }
}

/// Runs a side needs before a verdict: with 2 against 2 and no real difference, the ranges miss
/// each other by chance a third of the time; with 3 against 3, a tenth.
pub const MIN_RUNS: usize = 3;

/// What a comparison of two spreads of times may claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every repeat of the one took less time than every repeat of the other.
    Faster,
    Slower,
    /// The ranges overlap: no difference is claimed.
    WithinSpread,
    /// A side was measured fewer than [`MIN_RUNS`] times: its range says too little, so no
    /// difference is claimed.
    TooFewRuns,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Faster => "faster",
            Self::Slower => "slower",
            Self::WithinSpread => "within spread",
            Self::TooFewRuns => "too few runs to judge",
        }
    }
}

/// `base / time` of two spreads of times: the ratio of medians, the range it can take between
/// any repeat of one and any of the other, and the verdict on the time ranges.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Speedup {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub verdict: Verdict,
}

impl Speedup {
    pub fn of(base: Spread, time: Spread) -> Self {
        let verdict = if time.n < MIN_RUNS || base.n < MIN_RUNS {
            Verdict::TooFewRuns
        } else if time.max < base.min {
            Verdict::Faster
        } else if time.min > base.max {
            Verdict::Slower
        } else {
            Verdict::WithinSpread
        };
        Self {
            median: base.median / time.median,
            min: base.min / time.max,
            max: base.max / time.min,
            verdict,
        }
    }

    pub fn json(&self) -> Value {
        json!({ "median": self.median, "min": self.min, "max": self.max,
                "verdict": self.verdict.as_str() })
    }
}

/// The closest non-increasing sequence to `y` in least squares (pool adjacent violators): the
/// eval loss of a run that trains is expected to fall, so a single lucky evaluation does not
/// decide when a target was reached.
pub fn nonincreasing(y: &[f64]) -> Vec<f64> {
    // Blocks of (mean, count), merged while a later block's mean exceeds an earlier one's.
    let mut blocks: Vec<(f64, usize)> = Vec::with_capacity(y.len());
    for &v in y {
        blocks.push((v, 1));
        while blocks.len() > 1 {
            let (b, nb) = blocks[blocks.len() - 1];
            let (a, na) = blocks[blocks.len() - 2];
            if b <= a {
                break;
            }
            blocks.pop();
            let last = blocks.len() - 1;
            blocks[last] = ((a * na as f64 + b * nb as f64) / (na + nb) as f64, na + nb);
        }
    }
    blocks.into_iter().flat_map(|(m, n)| std::iter::repeat_n(m, n)).collect()
}

/// The first x at which the piecewise-linear curve through `points` (x increasing) is at or
/// below `target`, interpolated between the two points around the crossing.
pub fn first_at_or_below(points: &[(f64, f64)], target: f64) -> Option<f64> {
    let first = points.first()?;
    if first.1 <= target {
        return Some(first.0);
    }
    points.windows(2).find(|w| w[1].1 <= target).map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        x0 + (x1 - x0) * (y0 - target) / (y0 - y1)
    })
}

/// The curve's value at `x`, interpolated; `None` outside the points' range.
pub fn value_at(points: &[(f64, f64)], x: f64) -> Option<f64> {
    let (first, last) = (points.first()?, points.last()?);
    if x < first.0 || x > last.0 {
        return None;
    }
    if points.len() == 1 {
        return Some(first.1);
    }
    points.windows(2).find(|w| x <= w[1].0).map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if x1 > x0 {
            y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        } else {
            y1
        }
    })
}

/// The curve's slope around `x` (per unit of x), from the two points either side of it.
pub fn slope_at(points: &[(f64, f64)], x: f64) -> Option<f64> {
    points.windows(2).find(|w| x <= w[1].0 && w[1].0 > w[0].0).map(|w| {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        (y1 - y0) / (x1 - x0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_is_median_and_range_of_finite_values() {
        let s = Spread::of([3.0, 1.0, f64::NAN, 2.0, 10.0]).unwrap();
        assert_eq!(s, Spread { median: 2.5, min: 1.0, max: 10.0, n: 4 });
        assert_eq!(Spread::of([5.0]).unwrap().median, 5.0);
        assert!(Spread::of([f64::NAN]).is_none());
        assert_eq!(Spread::from_json(&s.json()), Some(s));
    }

    #[test]
    fn faster_only_when_the_ranges_do_not_overlap() {
        let base = Spread::of([100.0, 110.0, 120.0]).unwrap();
        let quick = Spread::of([70.0, 80.0, 99.0]).unwrap();
        let s = Speedup::of(base, quick);
        assert_eq!(s.verdict, Verdict::Faster);
        assert!((s.median - 110.0 / 80.0).abs() < 1e-12);
        assert!((s.min - 100.0 / 99.0).abs() < 1e-12 && (s.max - 120.0 / 70.0).abs() < 1e-12);
        let overlapping = Spread::of([70.0, 80.0, 101.0]).unwrap();
        assert_eq!(Speedup::of(base, overlapping).verdict, Verdict::WithinSpread);
        assert_eq!(Speedup::of(quick, base).verdict, Verdict::Slower);
        let twice = Spread::of([50.0, 51.0]).unwrap();
        assert_eq!(Speedup::of(base, twice).verdict, Verdict::TooFewRuns);
    }

    #[test]
    fn the_fit_never_rises_and_keeps_a_falling_curve() {
        assert_eq!(nonincreasing(&[3.0, 2.0, 1.0]), vec![3.0, 2.0, 1.0]);
        assert_eq!(nonincreasing(&[3.0, 1.0, 2.0, 0.5]), vec![3.0, 1.5, 1.5, 0.5]);
        assert_eq!(nonincreasing(&[1.0, 2.0, 3.0]), vec![2.0, 2.0, 2.0]);
        let fit = nonincreasing(&[2.29, 2.287, 2.287, 2.296, 2.296, 2.282, 2.287]);
        assert!(fit.windows(2).all(|w| w[1] <= w[0]), "{fit:?}");
        assert!(nonincreasing(&[]).is_empty());
    }

    #[test]
    fn crossings_and_values_are_interpolated() {
        let pts = [(0.0, 3.0), (10.0, 2.0), (20.0, 1.0)];
        assert_eq!(first_at_or_below(&pts, 2.5), Some(5.0));
        assert_eq!(first_at_or_below(&pts, 1.0), Some(20.0));
        assert_eq!(first_at_or_below(&pts, 3.5), Some(0.0));
        assert_eq!(first_at_or_below(&pts, 0.5), None);
        assert_eq!(value_at(&pts, 15.0), Some(1.5));
        assert_eq!(value_at(&pts, 25.0), None);
        assert_eq!(slope_at(&pts, 12.0), Some(-0.1));
    }
}
