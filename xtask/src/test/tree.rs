//! A run of the suite must leave the work tree as it found it: what git reports as changed or
//! untracked (ignored paths aside) is compared before and after, contents included.

use std::{
    collections::BTreeMap,
    hash::{DefaultHasher, Hash as _, Hasher as _},
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::run::workspace_root;

/// Each path git lists as changed or untracked, with its status and a hash of its contents.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot(Option<BTreeMap<String, (String, u64)>>);

impl Snapshot {
    /// The tree's state now; `None` inside (outside a git checkout there is nothing to compare).
    pub fn take() -> anyhow::Result<Self> {
        let root = workspace_root();
        let out = Command::new("git")
            .args(["status", "--porcelain=v1", "-z", "--untracked-files=all"])
            .current_dir(&root)
            .output();
        let Ok(out) = out.as_ref().map(|o| (o.status.success(), &o.stdout)) else {
            return Ok(Self(None));
        };
        if !out.0 {
            return Ok(Self(None));
        }
        let text = String::from_utf8_lossy(out.1);
        let mut entries = BTreeMap::new();
        let mut fields = text.split('\0').filter(|f| !f.is_empty());
        while let Some(entry) = fields.next() {
            let (code, path) = entry.split_at(entry.len().min(3));
            if code.starts_with('R') || code.starts_with('C') {
                fields.next(); // the rename's source
            }
            let mut h = DefaultHasher::new();
            std::fs::read(root.join(path)).ok().hash(&mut h);
            entries.insert(path.to_owned(), (code.trim().to_owned(), h.finish()));
        }
        Ok(Self(Some(entries)))
    }

    /// Fails naming every path the run changed, added or removed.
    pub fn unchanged(&self) -> anyhow::Result<()> {
        let now = Self::take().context("reading the work tree's state after the run")?;
        let (Some(before), Some(after)) = (&self.0, &now.0) else { return Ok(()) };
        let mut changed: Vec<String> = after
            .iter()
            .filter(|(p, s)| before.get(*p) != Some(*s))
            .map(|(p, (code, _))| format!("{code} {p}"))
            .collect();
        changed.extend(
            before.keys().filter(|p| !after.contains_key(*p)).map(|p| format!("reverted {p}")),
        );
        if !changed.is_empty() {
            bail!(
                "the run left the work tree changed (a step writes into the tree; it must write under target/ or a temporary directory):\n  {}",
                changed.join("\n  ")
            );
        }
        eprintln!("test: the work tree is as the run found it");
        Ok(())
    }
}
