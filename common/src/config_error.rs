//! Where a configuration file (a policy, a lab scenario) is wrong: file, line, column and what.
//! Host-side only (`std` feature).

use std::fmt;

/// A configuration file that cannot be used, with where the problem is: 1-based line and
/// column, or 0:0 for a file that could not be read at all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl ConfigError {
    /// An error at byte `offset` of the file's text `src`.
    pub fn at(file: &str, src: &str, offset: usize, message: impl Into<String>) -> Self {
        let (line, column) = line_col(src, offset);
        Self { file: file.to_owned(), line, column, message: message.into() }
    }

    /// A file that could not be read (or is not text): no position.
    pub fn unreadable(file: &str, message: impl Into<String>) -> Self {
        Self { file: file.to_owned(), line: 0, column: 0, message: message.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)
    }
}

impl std::error::Error for ConfigError {}

/// 1-based line and column (in characters) of byte `offset` in `src`.
pub fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = &src[..offset.min(src.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_from_one() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("é\nx", 2), (1, 2), "columns count characters, not bytes");
        let e = ConfigError::at("p.toml", "a = 1\nb = x", 10, "bad");
        assert_eq!(e.to_string(), "p.toml:2:5: bad");
    }
}
