//! The status API's one decision, pure: a request line's bytes to the reply line. The server
//! (`status::serve`) reads at most [`MAX_REQUEST`] bytes of a line and sends what this returns;
//! the fuzz target `status_request` feeds it arbitrary bytes.

use serde_json::json;

use super::status::Status;

/// The longest request read ("status" and a newline are 7 bytes): a client cannot make the
/// daemon buffer more than this.
pub const MAX_REQUEST: usize = 256;

/// The reply to a client that is neither root nor the daemon's own user.
pub const REFUSED: &str = "{\"error\":\"permission denied: the status API is root-only\"}";

/// The reply (one line of JSON, no newline) to `request`: the bytes read up to and including
/// the first newline, at most [`MAX_REQUEST`] + 1 of them. "status" or an empty line (spaces
/// around it are ignored) gets `status()` as JSON; anything else an error object naming it.
pub fn reply(request: &[u8], status: impl FnOnce() -> Status) -> String {
    let line = request.strip_suffix(b"\n").unwrap_or(request);
    if line.len() > MAX_REQUEST {
        return error(format!(
            "request longer than {MAX_REQUEST} bytes: the API answers \"status\""
        ));
    }
    let Ok(text) = std::str::from_utf8(line) else {
        return error("the request is not UTF-8: the API answers \"status\"".to_owned());
    };
    match text.trim() {
        "" | "status" => serde_json::to_string(&status())
            .unwrap_or_else(|e| error(format!("the status could not be encoded: {e}"))),
        other => error(format!("unknown request {other:?}: the API answers \"status\"")),
    }
}

fn error(message: String) -> String {
    json!({ "error": message }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error_of(reply: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(reply).unwrap();
        v["error"].as_str().unwrap_or_default().to_owned()
    }

    #[test]
    fn status_and_an_empty_line_get_the_status() {
        for request in [&b"status\n"[..], b"  status \r\n", b"\n", b""] {
            let r = reply(request, || Status { pid: 42, ..Status::default() });
            let s: Status = serde_json::from_str(&r).unwrap();
            assert_eq!(s.pid, 42, "{request:?}");
        }
    }

    #[test]
    fn anything_else_gets_an_error_naming_it() {
        let r = reply(b"metrics\n", Status::default);
        assert_eq!(error_of(&r), "unknown request \"metrics\": the API answers \"status\"");
        // Control characters and quotes stay inside one JSON line.
        let r = reply(b"a\"\x1b\tb\n", Status::default);
        assert!(!r.contains('\n'), "{r}");
        assert!(error_of(&r).starts_with("unknown request \"a\\\"\\u{1b}\\tb\""), "{r}");
    }

    #[test]
    fn bytes_that_are_not_utf8_or_too_many_get_an_error() {
        assert!(error_of(&reply(b"st\xffatus\n", Status::default)).contains("not UTF-8"));
        let long = vec![b'a'; MAX_REQUEST + 1];
        assert!(error_of(&reply(&long, Status::default)).contains("longer than 256 bytes"));
        let mut fits = vec![b'a'; MAX_REQUEST];
        fits.push(b'\n');
        assert!(error_of(&reply(&fits, Status::default)).starts_with("unknown request"));
    }
}
