//! Job reports as the daemon reads them: the directory is world-writable, so any bytes may be
//! in a report, and a process may rewrite its report with anything between two reads.

use std::time::{Duration, Instant};

use linkpilot::{
    board::job_reports::{parse, REPORT_SIZE},
    daemon::jobs::Jobs,
};

pub fn check(data: &[u8]) {
    // Files of any other size are refused before parsing; pad most inputs with spaces (as the
    // training side does) so the fuzzer works on the text (the first byte says which). A NUL
    // splits an input into two reports: two reads of one process's file, a second apart.
    let Some((&exact, rest)) = data.split_first() else { return };
    let t0 = Instant::now();
    let mut jobs = Jobs::default();
    for (i, text) in rest.split(|&b| b == 0).take(2).enumerate() {
        let mut bytes = text.to_vec();
        if exact & 1 == 0 && bytes.len() < REPORT_SIZE {
            bytes.resize(REPORT_SIZE, b' ');
        }
        let Ok(r) = parse(&bytes) else { continue };
        assert_eq!(bytes.len(), REPORT_SIZE);
        let now = t0 + Duration::from_secs(i as u64);
        let reading = jobs.update(now, vec![("1-0123456789abcdef".into(), r)], |_| {
            Some(("wan".into(), Some(1e9)))
        });
        serde_json::to_string(&reading.jobs).expect("jobs serialise for the status API");
    }
}
