//! A run of the suite must leave the work tree as it found it: what git reports as changed or
//! untracked (ignored paths aside) is compared before and after, contents included.

use std::{
    collections::BTreeMap,
    hash::{DefaultHasher, Hash as _, Hasher as _},
    path::PathBuf,
    process::Command,
};

use anyhow::{bail, Context as _};

use crate::run::workspace_root;

/// Each path git lists as changed or untracked, with its status and a hash of its contents.
#[derive(Debug, PartialEq, Eq)]
pub struct Snapshot {
    root: PathBuf,
    entries: Option<BTreeMap<String, (String, u64)>>,
}

impl Snapshot {
    /// The workspace's state now.
    pub fn take() -> anyhow::Result<Self> {
        Self::take_in(workspace_root())
    }

    /// The state of the work tree at `root` now; nothing to compare outside a git checkout.
    fn take_in(root: PathBuf) -> anyhow::Result<Self> {
        let out = Command::new("git")
            .args(["status", "--porcelain=v1", "-z", "--untracked-files=all"])
            .current_dir(&root)
            .output();
        let Ok(out) = out.as_ref().map(|o| (o.status.success(), &o.stdout)) else {
            return Ok(Self { root, entries: None });
        };
        if !out.0 {
            return Ok(Self { root, entries: None });
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
        Ok(Self { root, entries: Some(entries) })
    }

    /// Fails naming every path the run changed, added or removed.
    pub fn unchanged(&self) -> anyhow::Result<()> {
        let now = Self::take_in(self.root.clone())
            .context("reading the work tree's state after the run")?;
        let (Some(before), Some(after)) = (&self.entries, &now.entries) else { return Ok(()) };
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

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn git(root: &std::path::Path, args: &[&str]) {
        let st = Command::new("git").args(args).current_dir(root).status().expect("git");
        assert!(st.success(), "git {args:?}");
    }

    #[test]
    fn a_changed_added_or_removed_file_fails_the_check_and_an_ignored_one_does_not() {
        let root = std::env::temp_dir().join(format!("xtask-tree-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).unwrap();
        git(&root, &["init", "-q"]);
        fs::write(root.join(".gitignore"), "/target\n").unwrap();
        fs::write(root.join("kept"), "a").unwrap();
        fs::write(root.join("dirty"), "before the run").unwrap();
        git(&root, &["add", "."]);
        git(&root, &["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]);
        // Dirty before the run: only a change made during the run counts.
        fs::write(root.join("dirty"), "changed before the run").unwrap();
        let before = Snapshot::take_in(root.clone()).unwrap();
        fs::create_dir_all(root.join("target")).unwrap();
        fs::write(root.join("target/out"), "ignored").unwrap();
        before.unchanged().expect("nothing the run did is tracked");
        fs::write(root.join("kept"), "b").unwrap();
        fs::write(root.join("new"), "n").unwrap();
        fs::write(root.join("dirty"), "changed by the run").unwrap();
        let err = format!("{:#}", before.unchanged().unwrap_err());
        for path in ["M kept", "?? new", "M dirty"] {
            assert!(err.contains(path), "{path} in {err}");
        }
        let _ = fs::remove_dir_all(&root);
    }
}
