//! libFuzzer's entry point for `linkpilot_fuzz::tuner_decision`, with a logger like NCCL's that
//! checks every message the plugin logs is one NUL-terminated line (C-variadic: nightly only).
#![no_main]
#![feature(c_variadic)]

use std::ffi::{c_char, c_int, c_ulong, CStr};

/// NCCL's logger: printf-like, called with "%s" and one string.
unsafe extern "C" fn logger(
    _level: c_int,
    _flags: c_ulong,
    _file: *const c_char,
    _line: c_int,
    fmt: *const c_char,
    mut args: ...
) {
    // SAFETY: the plugin passes a NUL-terminated format and, for "%s", one string.
    unsafe {
        assert_eq!(CStr::from_ptr(fmt).to_bytes(), b"%s");
        let line = CStr::from_ptr(args.next_arg::<*const c_char>()).to_bytes();
        assert!(line.len() < 512 && !line.contains(&b'\n'), "{line:?}");
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| linkpilot_fuzz::tuner_decision::check(
    data,
    Some(logger)
));
