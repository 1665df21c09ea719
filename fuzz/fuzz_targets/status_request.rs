//! The status socket's request line, as the daemon reads it (at most MAX_REQUEST + 1 bytes up
//! to a newline): every reply is one line of JSON, the status or an error object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use linkpilot::daemon::{
    status::Status,
    status_request::{reply, MAX_REQUEST},
};

fuzz_target!(|data: &[u8]| {
    // What the server's read can hand over: up to the first newline, at most MAX_REQUEST + 1.
    let n = data.iter().position(|&b| b == b'\n').map_or(data.len(), |i| i + 1);
    let request = &data[..n.min(MAX_REQUEST + 1)];
    let answer = reply(request, || Status { pid: 7, ..Status::default() });
    assert!(!answer.contains('\n'), "a reply of more than one line: {answer:?}");
    let v: serde_json::Value = serde_json::from_str(&answer).expect("the reply is JSON");
    let asked =
        std::str::from_utf8(request.strip_suffix(b"\n").unwrap_or(request)).ok().map(str::trim);
    if matches!(asked, Some("" | "status")) {
        assert_eq!(v["pid"], 7, "status asked, {answer} answered");
    } else {
        assert!(v["error"].is_string(), "{request:?} answered {answer}");
    }
});
