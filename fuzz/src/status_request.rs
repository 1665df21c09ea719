//! The status socket's request line, as the daemon reads it (at most MAX_REQUEST + 1 bytes up
//! to a newline): every reply is one line of JSON, the status or an error object.

use linkpilot::daemon::{
    status::Status,
    status_request::{reply, MAX_REQUEST},
};

pub fn check(data: &[u8]) {
    // What the server's read can hand over: up to the first newline, at most MAX_REQUEST + 1.
    let n = data.iter().position(|&b| b == b'\n').map_or(data.len(), |i| i + 1);
    let request = &data[..n.min(MAX_REQUEST + 1)];
    let answer = reply(request, || Status { pid: 7, ..Status::default() });
    assert!(!answer.contains('\n'), "a reply of more than one line: {answer:?}");
    let v: serde_json::Value = serde_json::from_str(&answer).expect("the reply is JSON");
    let line = request.strip_suffix(b"\n").unwrap_or(request);
    // A line over the limit is refused whatever it holds (blanks around "status" included).
    let asked = (line.len() <= MAX_REQUEST).then(|| std::str::from_utf8(line).ok()).flatten();
    if matches!(asked.map(str::trim), Some("" | "status")) {
        assert_eq!(v["pid"], 7, "status asked, {answer} answered");
    } else {
        assert!(v["error"].is_string(), "{request:?} answered {answer}");
    }
}
