//! A state's transport profile (`[state.transport]`): what the sock_ops program gives TCP
//! connections to the link's peers. Every field is optional; one left out is the kernel's.

use std::fmt;

use linkpilot_common::transport::{TransportProfile, CC_NAME_LEN};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A congestion control algorithm's name (`TCP_CONGESTION`): 1 to 15 bytes of `[a-z0-9_]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CcName([u8; CC_NAME_LEN]);

impl CcName {
    pub fn new(name: &str) -> Result<Self, String> {
        let ok = !name.is_empty()
            && name.len() < CC_NAME_LEN
            && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(format!(
                "congestion control {name:?} is not an algorithm's name (1 to {} characters of \
                 a-z, 0-9 and _)",
                CC_NAME_LEN - 1
            ));
        }
        let mut b = [0u8; CC_NAME_LEN];
        b[..name.len()].copy_from_slice(name.as_bytes());
        Ok(Self(b))
    }

    pub fn as_str(&self) -> &str {
        let n = self.0.iter().position(|&b| b == 0).unwrap_or(CC_NAME_LEN);
        // Only ASCII is ever stored (see new).
        std::str::from_utf8(&self.0[..n]).unwrap_or("")
    }

    pub fn bytes(&self) -> [u8; CC_NAME_LEN] {
        self.0
    }
}

impl fmt::Display for CcName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for CcName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.as_str())
    }
}

impl Serialize for CcName {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CcName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(&s).map_err(serde::de::Error::custom)
    }
}

/// A transport profile with its socket buffers resolved (the knobs a decision sets).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transport {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_control: Option<CcName>,
    /// Segments; 0: the kernel's.
    #[serde(default)]
    pub initial_cwnd: u32,
    #[serde(default)]
    pub initial_rwnd: u32,
    #[serde(default)]
    pub sndcwnd_clamp: u32,
    /// SO_SNDBUF and SO_RCVBUF, bytes; 0: the kernel's autotuning.
    #[serde(default)]
    pub socket_buffer: u64,
    #[serde(default)]
    pub ecn: bool,
}

impl Transport {
    /// The program's form, for one generation of the profile.
    pub fn profile(&self, generation: u32) -> TransportProfile {
        TransportProfile {
            enabled: 1,
            generation,
            congestion_control: self.congestion_control.map_or([0; CC_NAME_LEN], |c| c.bytes()),
            initial_cwnd: self.initial_cwnd,
            initial_rwnd: self.initial_rwnd,
            sndcwnd_clamp: self.sndcwnd_clamp,
            // The kernel takes an int and caps it at rmem_max/wmem_max anyway.
            socket_buffer: self.socket_buffer.min(i32::MAX as u64) as u32,
            ecn: u32::from(self.ecn),
        }
    }
}

impl fmt::Display for Transport {
    /// `cc=bbr iw=10 rwnd=64 clamp=1000 buf=64MiB ecn`, the fields set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(c) = self.congestion_control {
            parts.push(format!("cc={c}"));
        }
        for (k, v) in
            [("iw", self.initial_cwnd), ("rwnd", self.initial_rwnd), ("clamp", self.sndcwnd_clamp)]
        {
            if v != 0 {
                parts.push(format!("{k}={v}"));
            }
        }
        if self.socket_buffer != 0 {
            parts.push(format!("buf={}", super::knobs::bytes(self.socket_buffer)));
        }
        if self.ecn {
            parts.push("ecn".into());
        }
        if parts.is_empty() {
            f.write_str("kernel defaults")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// A link's profile as reasons, status and logs show it: "untouched" without one.
pub fn describe(t: Option<Transport>) -> String {
    t.map_or_else(|| "untouched".to_owned(), |t| t.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_profiles() {
        let bbr = CcName::new("bbr").unwrap();
        assert_eq!((bbr.as_str(), bbr.to_string()), ("bbr", "bbr".to_owned()));
        for bad in ["", "BBR", "a-b", "sixteen_chars_xx"] {
            assert!(CcName::new(bad).is_err(), "{bad:?}");
        }
        let t = Transport {
            congestion_control: Some(bbr),
            initial_cwnd: 10,
            socket_buffer: 64 << 20,
            ecn: true,
            ..Transport::default()
        };
        assert_eq!(t.to_string(), "cc=bbr iw=10 buf=64MiB ecn");
        assert_eq!(Transport::default().to_string(), "kernel defaults");
        let p = t.profile(3);
        assert_eq!((p.enabled, p.generation, p.initial_cwnd, p.ecn), (1, 3, 10, 1));
        assert_eq!(&p.congestion_control[..4], b"bbr\0");
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Transport>(&json).unwrap(), t);
    }
}
