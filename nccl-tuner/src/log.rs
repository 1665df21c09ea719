//! Messages through NCCL's own logger (NCCL_DEBUG=INFO shows them, prefixed "linkpilot:"),
//! formatted into a stack buffer. Only changes are logged, so the calls that change nothing
//! never get here.

use std::fmt::{self, Write};

use crate::abi::{Logger, LOG_FLAGS, LOG_INFO};

/// A message of at most 511 bytes (longer ones are cut), NUL-terminated for C.
pub struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    pub fn new() -> Self {
        let mut l = Self { buf: [0; 512], len: 0 };
        let _ = l.write_str("linkpilot: ");
        l
    }

    #[cfg(test)]
    pub fn as_str(&self) -> &str {
        // Only whole `str`s are ever copied in (cut at a char boundary).
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or("")
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len() - 1 - self.len;
        let mut n = s.len().min(room);
        while !s.is_char_boundary(n) {
            n -= 1;
        }
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Hands `line` to NCCL's logger at INFO level (nothing without a logger).
pub fn emit(logger: Option<Logger>, line: &Line) {
    let Some(log) = logger else { return };
    let mut c = [0u8; 512];
    c[..line.len].copy_from_slice(&line.buf[..line.len]);
    // SAFETY: NCCL's logger is printf-like; "%s" consumes exactly the one NUL-terminated string
    // passed (`c` ends in at least one NUL: at most 511 bytes are ever written).
    unsafe {
        log(LOG_INFO, LOG_FLAGS, c"nccl-tuner".as_ptr(), 0, c"%s".as_ptr(), c.as_ptr());
    }
}

/// `format!`-like logging: `say!(logger, "x {}", y)`.
macro_rules! say {
    ($logger:expr, $($arg:tt)*) => {{
        let mut line = $crate::log::Line::new();
        let _ = ::std::fmt::Write::write_fmt(&mut line, format_args!($($arg)*));
        $crate::log::emit($logger, &line);
    }};
}
pub(crate) use say;

/// "4MiB", "1.5KiB", "512B": sizes in messages.
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        for (scale, unit) in
            [(1u64 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
        {
            if b >= scale {
                return if b.is_multiple_of(scale) {
                    write!(f, "{}{unit}", b / scale)
                } else {
                    write!(f, "{:.1}{unit}", b as f64 / scale as f64)
                };
            }
        }
        write!(f, "{b}B")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lines_are_cut_at_a_char_boundary() {
        let mut l = Line::new();
        for _ in 0..300 {
            let _ = l.write_str("é");
        }
        assert!(l.as_str().len() <= 511 && l.as_str().starts_with("linkpilot: é"));
        assert_eq!(Bytes(4 << 20).to_string(), "4MiB");
        assert_eq!(Bytes(1536).to_string(), "1.5KiB");
        assert_eq!(Bytes(100).to_string(), "100B");
    }
}
