//! Human units in configuration files (lab scenarios, policies): "90ms", "200Mbit/s", "2MiB",
//! "0.5%", "1000/s". Each type deserializes from a string, so a bad value is reported by the TOML
//! parser at its line and column. Host-side only (`std` feature).

use std::{fmt, str::FromStr};

use serde::{de, Deserialize, Deserializer};

/// A duration in nanoseconds: "90ms", "1.5s", "250us", "0".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Nanos(pub u64);

/// A rate in bits per second: "200Mbit/s", "40Gbit/s", "1.5kbit/s".
#[derive(Clone, Copy, Debug, PartialEq, PartialOrd)]
pub struct BitRate(pub f64);

/// A size in bytes: "2MiB", "64KiB", "1500B", "1MB".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Bytes(pub u64);

/// A fraction in [0, 1], written as a percentage: "0.5%".
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Fraction(pub f64);

/// A non-negative ratio written as a percentage that may exceed 100%: "20%", "150%" (RTT
/// inflation over its baseline).
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct Percent(pub f64);

/// Events per second: "1000/s", "2.5k/s".
#[derive(Clone, Copy, Debug, Default, PartialEq, PartialOrd)]
pub struct PerSecond(pub f64);

fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let value: f64 = num.parse().ok()?;
    value.is_finite().then_some((value, unit.trim()))
}

/// A number followed by one of `units` (name, scale): the number and the number times the
/// scale. `what` and `example` make the error, which lists the units.
fn scaled(s: &str, what: &str, units: &[(&str, f64)], example: &str) -> Result<(f64, f64), String> {
    let bad = || {
        let names: Vec<&str> = units.iter().map(|(n, _)| *n).collect();
        format!(
            "invalid {what} {s:?}: expected a number and a unit: {} (e.g. \"{example}\")",
            names.join(", ")
        )
    };
    let (v, unit) = split_number(s).ok_or_else(bad)?;
    let (_, scale) = units.iter().find(|(n, _)| *n == unit).ok_or_else(bad)?;
    Ok((v, v * scale))
}

impl FromStr for Nanos {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if split_number(s) == Some((0.0, "")) {
            return Ok(Self(0));
        }
        const UNITS: &[(&str, f64)] =
            &[("ns", 1.0), ("us", 1e3), ("µs", 1e3), ("ms", 1e6), ("s", 1e9), ("min", 60e9)];
        let (_, ns) = scaled(s, "duration", UNITS, "90ms")?;
        if ns > u64::MAX as f64 / 2.0 {
            return Err(format!("duration {s:?} is too large"));
        }
        Ok(Self(ns.round() as u64))
    }
}

impl FromStr for BitRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const UNITS: &[(&str, f64)] =
            &[("bit/s", 1.0), ("kbit/s", 1e3), ("Mbit/s", 1e6), ("Gbit/s", 1e9)];
        let (v, bps) = scaled(s, "rate", UNITS, "200Mbit/s")?;
        if v <= 0.0 {
            return Err(format!("rate {s:?} must be above zero"));
        }
        Ok(Self(bps))
    }
}

impl FromStr for Bytes {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        const UNITS: &[(&str, f64)] = &[
            ("B", 1.0),
            ("KiB", 1024.0),
            ("MiB", 1024.0 * 1024.0),
            ("GiB", 1024.0 * 1024.0 * 1024.0),
            ("kB", 1e3),
            ("MB", 1e6),
            ("GB", 1e9),
        ];
        let (_, bytes) = scaled(s, "size", UNITS, "2MiB")?;
        Ok(Self(bytes.round() as u64))
    }
}

/// A number followed by %, over 100; `example` for the error.
fn percentage(s: &str, example: &str) -> Result<f64, String> {
    match split_number(s) {
        Some((v, "%")) => Ok(v / 100.0),
        _ => Err(format!(
            "invalid percentage {s:?}: expected a number followed by % (e.g. \"{example}\")"
        )),
    }
}

impl FromStr for Fraction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let v = percentage(s, "0.5%")?;
        if v > 1.0 {
            return Err(format!("percentage {s:?} is above 100%"));
        }
        Ok(Self(v))
    }
}

impl FromStr for Percent {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        percentage(s, "20%").map(Self)
    }
}

impl FromStr for PerSecond {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid rate {s:?}: expected a number and /s or k/s (e.g. \"1000/s\")");
        match split_number(s).ok_or_else(bad)? {
            (v, "/s") => Ok(Self(v)),
            (v, "k/s") => Ok(Self(v * 1e3)),
            _ => Err(bad()),
        }
    }
}

macro_rules! deserialize_from_str {
    ($($t:ty => $what:literal),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct V;
                impl de::Visitor<'_> for V {
                    type Value = $t;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str($what)
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<$t, E> {
                        s.parse().map_err(E::custom)
                    }
                }
                d.deserialize_str(V)
            }
        }
    )*};
}

deserialize_from_str!(
    Nanos => "a duration string such as \"90ms\"",
    BitRate => "a rate string such as \"200Mbit/s\"",
    Bytes => "a size string such as \"2MiB\"",
    Fraction => "a percentage string such as \"0.5%\"",
    Percent => "a percentage string such as \"20%\"",
    PerSecond => "a rate string such as \"1000/s\""
);

impl fmt::Display for Nanos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}ms", self.0 as f64 / 1e6)
    }
}

impl fmt::Display for BitRate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1}Mbit/s", self.0 / 1e6)
    }
}

impl fmt::Display for Bytes {
    /// Exact multiples as "8MiB", others to one decimal ("1.7GiB").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (scale, unit) in UNITS {
            if self.0 >= scale {
                return if self.0.is_multiple_of(scale) {
                    write!(f, "{}{unit}", self.0 / scale)
                } else {
                    write!(f, "{:.1}{unit}", self.0 as f64 / scale as f64)
                };
            }
        }
        write!(f, "{}B", self.0)
    }
}

impl fmt::Display for Fraction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0 * 100.0)
    }
}

impl fmt::Display for Percent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.0 * 100.0)
    }
}

impl fmt::Display for PerSecond {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/s", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!("90ms".parse::<Nanos>().unwrap(), Nanos(90_000_000));
        assert_eq!("1.5s".parse::<Nanos>().unwrap(), Nanos(1_500_000_000));
        assert_eq!("250us".parse::<Nanos>().unwrap(), Nanos(250_000));
        assert_eq!("0".parse::<Nanos>().unwrap(), Nanos(0));
        assert_eq!("200Mbit/s".parse::<BitRate>().unwrap(), BitRate(200e6));
        assert_eq!("2MiB".parse::<Bytes>().unwrap(), Bytes(2 << 20));
        assert_eq!("0.5%".parse::<Fraction>().unwrap(), Fraction(0.005));
    }

    #[test]
    fn rejects_with_a_hint() {
        for (bad, hint) in
            [("90", "unit"), ("ms", "number"), ("5 parsecs", "unit"), ("-3ms", "number")]
        {
            let e = bad.parse::<Nanos>().unwrap_err();
            assert!(e.contains("invalid duration") && e.contains("90ms"), "{bad}: {e} ({hint})");
        }
        assert!("0bit/s".parse::<BitRate>().unwrap_err().contains("above zero"));
        assert!("200Mbps".parse::<BitRate>().unwrap_err().contains("Mbit/s"));
        assert!("101%".parse::<Fraction>().unwrap_err().contains("above 100%"));
        assert!("0.5".parse::<Fraction>().unwrap_err().contains("%"));
        assert!("1e400ms".parse::<Nanos>().is_err());
        assert_eq!("150%".parse::<Percent>().unwrap(), Percent(1.5));
        assert_eq!("2.5k/s".parse::<PerSecond>().unwrap(), PerSecond(2500.0));
        assert!("1000".parse::<PerSecond>().unwrap_err().contains("/s"));
        assert_eq!(Bytes(8 << 20).to_string(), "8MiB");
        assert_eq!(Bytes(1_814_319_894).to_string(), "1.7GiB");
        assert_eq!(Bytes(1500).to_string(), "1.5KiB");
    }
}
