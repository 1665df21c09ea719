//! A counter file of the NCCL tuner plugin, as the daemon reads it for `linkpilot status` and
//! the metrics: the directory is world-writable, so any bytes may be there.

use linkpilot::board::tuner_stats::parse;
use linkpilot_common::tuner::TUNER_SIZE;

pub fn check(data: &[u8]) {
    // Files of any other size are refused before parsing; pad or cut most inputs to the size
    // so the fuzzer works on the contents (the first byte says which).
    let Some((&exact, rest)) = data.split_first() else { return };
    let mut bytes = rest.to_vec();
    if exact & 1 == 0 {
        bytes.resize(TUNER_SIZE, 0);
    }
    if let Ok(p) = parse(&bytes) {
        assert_eq!(bytes.len(), TUNER_SIZE);
        serde_json::to_string(&p).expect("a counter file serialises for the status API");
    }
}
