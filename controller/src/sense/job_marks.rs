//! Whose congestion marks: of the CE-marked packets and ECE segments a peer's counters show,
//! how many fell on the flows of jobs reporting on this host. The flow table gives each job
//! flow's marks ([`JobMarks`]); each peer's counters give all of them ([`MarkSplit`]).

use std::collections::HashMap;

use linkpilot_common::{FlowKey, FlowState};

use super::snapshot::MarkCounts;

/// Marks of each marked flow (the jobs' and everyone else's) at the previous flow-table
/// reading, to count what each adds, and whether the jobs' flows were looked up since the flow
/// was first marked. Memory grows with the marked flows only.
#[derive(Default)]
pub struct JobMarks {
    prev: HashMap<FlowKey, Seen>,
    now: HashMap<FlowKey, Seen>,
    /// The jobs' flows were looked up for the reading under way.
    looked_up: bool,
}

#[derive(Clone, Copy, Debug)]
struct Seen {
    marks: (u64, u64),
    looked_up: bool,
}

/// (CE, ECE) added on the jobs' flows, by (ifindex, peer id).
pub type Added = HashMap<(u32, u32), (u64, u64)>;

impl JobMarks {
    /// Whether `flows` (a flow-table reading) hold a marked flow, not one of `jobs`, first
    /// marked since the jobs' flows were last looked up: a job connection that opened since
    /// then would have its marks counted as others' until the next look-up.
    pub fn unknown_owner(
        &self,
        flows: &[(FlowKey, FlowState)],
        is_job: impl Fn(&FlowKey, &FlowState) -> bool,
    ) -> bool {
        flows.iter().any(|(k, f)| {
            (f.ce_segs, f.ece_segs) != (0, 0)
                && !is_job(k, f)
                && !self.prev.get(k).is_some_and(|s| s.looked_up)
        })
    }

    /// The jobs' flows were just looked up: every flow marked so far, and every one of the
    /// coming reading, has had its owner checked.
    pub fn looked_up(&mut self) {
        self.looked_up = true;
        for s in self.prev.values_mut() {
            s.looked_up = true;
        }
    }

    /// A flow of this reading, of (ifindex, peer id) `row`, with (CE, ECE) `marks` so far; if
    /// it is a `job`'s, what it received since the previous reading goes to `out`. A flow
    /// without marks at the previous reading counts from zero: its entry starts at zero when
    /// it opens, so all its marks came since (also those before the daemon knew it for a
    /// job's, as long as it was told within the reading that first saw them).
    pub fn add(
        &mut self,
        k: &FlowKey,
        row: (u32, u32),
        marks: (u64, u64),
        job: bool,
        out: &mut Added,
    ) {
        if marks == (0, 0) {
            return;
        }
        let prev = self.prev.get(k);
        if job {
            let (ce, ece) = prev.map_or((0, 0), |s| s.marks);
            let e = out.entry(row).or_default();
            e.0 += marks.0.saturating_sub(ce);
            e.1 += marks.1.saturating_sub(ece);
        }
        let looked_up = self.looked_up || prev.is_some_and(|s| s.looked_up);
        self.now.insert(*k, Seen { marks, looked_up });
    }

    /// The reading is over: its marked flows are what the next one counts from (a flow gone
    /// from the table is forgotten).
    pub fn end_reading(&mut self) {
        // Swapped, not rebuilt: both maps keep their capacity from tick to tick.
        std::mem::swap(&mut self.prev, &mut self.now);
        self.now.clear();
        self.looked_up = false;
    }
}

/// One peer's marks between flow-table readings, and the jobs' shares at the last one.
#[derive(Clone, Copy, Debug, Default)]
pub struct MarkSplit {
    /// (CE, ECE) received since the last flow-table reading.
    since: (u64, u64),
    /// The jobs' shares of (CE, ECE) at the last reading that had marks.
    pub share: (f64, f64),
    /// Job marks seen on flows before the peer's counters had them.
    carry: (u64, u64),
}

impl MarkSplit {
    /// The peer's counters moved by (`ce`, `ece`) this tick.
    pub fn count(&mut self, ce: u64, ece: u64) {
        self.since.0 += ce;
        self.since.1 += ece;
    }

    /// No job reports: no share of the marks is a job's, whatever the last one was.
    pub fn clear_jobs(&mut self) {
        (self.share, self.carry) = ((0.0, 0.0), (0, 0));
    }

    /// A flow-table reading that found `job` (CE, ECE) added on the jobs' flows to this peer:
    /// the marks since the last reading, all and the jobs'.
    pub fn reading(&mut self, job: (u64, u64)) -> MarkCounts {
        let (ce, ece) = std::mem::take(&mut self.since);
        // The flow table is read just after the counters: a mark in between is already on its
        // flow but not yet on its peer. What runs ahead is carried to the next reading, where
        // the peer has it, so over readings the two agree exactly. Only this reading's marks
        // may wait for the next: an older remainder (marks a peer's counters never had: a
        // flow's row changed) is dropped, not held against later marks.
        let credit = |raw: u64, carry: &mut u64, all: u64| {
            let owed = raw.saturating_add(*carry);
            let now = owed.min(all);
            *carry = (owed - now).min(raw);
            now
        };
        let job_ce = credit(job.0, &mut self.carry.0, ce);
        let job_ece = credit(job.1, &mut self.carry.1, ece);
        // A reading without marks says nothing of whose they are: the last share holds (it
        // also stands for the ticks until the next reading).
        if ce > 0 {
            self.share.0 = job_ce as f64 / ce as f64;
        }
        if ece > 0 {
            self.share.1 = job_ece as f64 / ece as f64;
        }
        MarkCounts { ce, ece, job_ce, job_ece }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn job_marks_count_what_each_job_flow_adds() {
        let k = |port| FlowKey { local_port: port, ..FlowKey::default() };
        let mut m = JobMarks::default();
        let mut out = Added::new();
        m.add(&k(1), (3, 1), (10, 0), true, &mut out);
        m.end_reading();
        assert_eq!(out[&(3, 1)], (10, 0), "first marked: all its marks came since");
        let mut out = Added::new();
        m.add(&k(1), (3, 1), (15, 2), true, &mut out);
        m.end_reading();
        assert_eq!(out[&(3, 1)], (5, 2), "what it added");
        // Another's flow marked 4 times, then found to be a job's: only what came after.
        m.add(&k(2), (3, 1), (4, 0), false, &mut out);
        m.end_reading();
        assert_eq!(out[&(3, 1)], (5, 2), "not a job's");
        let mut out = Added::new();
        m.add(&k(2), (3, 1), (6, 0), true, &mut out);
        assert_eq!(out[&(3, 1)], (2, 0));
        m.end_reading();
        m.end_reading();
        assert!(m.prev.is_empty(), "a reading without them: forgotten");
    }

    #[test]
    fn a_flow_marked_since_the_last_look_up_asks_for_another() {
        let k = |port| FlowKey { local_port: port, ..FlowKey::default() };
        let marked = |port, ce| (k(port), FlowState { ce_segs: ce, ..FlowState::default() });
        let job_keys: HashSet<FlowKey> = [k(1)].into();
        let jobs = |k: &FlowKey, _: &FlowState| job_keys.contains(k);
        let mut m = JobMarks::default();
        let mut out = Added::new();
        assert!(!m.unknown_owner(&[marked(1, 5), marked(2, 0)], jobs), "a job's, an unmarked");
        assert!(m.unknown_owner(&[marked(2, 1)], jobs), "newly marked, owner unknown");
        m.add(&k(2), (3, 1), (1, 0), false, &mut out);
        m.end_reading();
        assert!(m.unknown_owner(&[marked(2, 2)], jobs), "still not looked up");
        m.looked_up();
        assert!(!m.unknown_owner(&[marked(2, 2)], jobs), "looked up: another's");
        m.add(&k(3), (3, 1), (1, 0), false, &mut out);
        m.end_reading();
        assert!(!m.unknown_owner(&[marked(3, 1)], jobs), "marked in the looked-up reading");
        m.add(&k(4), (3, 1), (1, 0), false, &mut out);
        m.end_reading();
        assert!(m.unknown_owner(&[marked(4, 1)], jobs), "marked after it");
    }

    #[test]
    fn marks_running_ahead_of_the_counters_are_carried_to_the_next_reading() {
        let mut p = MarkSplit::default();
        p.count(10, 0);
        // The flow table shows 12 job marks: 2 came after the counters were read.
        assert_eq!(p.reading((12, 0)), MarkCounts { ce: 10, job_ce: 10, ..MarkCounts::default() });
        p.count(5, 0);
        assert_eq!(p.reading((3, 0)).job_ce, 5, "3 new and the 2 carried");
        assert_eq!(p.share.0, 1.0);
        assert_eq!(p.reading((0, 0)), MarkCounts::default());
        assert_eq!(p.share.0, 1.0, "a reading without marks keeps the share");
        p.clear_jobs();
        assert_eq!(p.share, (0.0, 0.0));
    }
}
