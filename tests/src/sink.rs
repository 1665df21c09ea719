//! A TCP receiving end for the lab tests, run with the tests' Python: accepts one connection on
//! argv[1]:argv[2] and reads it until it closes. With `LINKPILOT_JOBS` set it is a job: it
//! publishes a job report first (the Python package's writer, as a training rank does), so the
//! daemon takes its connection for a job's.
pub const RECEIVER: &str = r#"
import os, socket, sys
if "LINKPILOT_JOBS" in os.environ:
    from linkpilot.jobreport import JobReport
    report = JobReport(os.environ["LINKPILOT_JOBS"], rank=0, world=1, kind="ddp", job="test-job")
listener = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, _ = listener.accept()
while conn.recv(1 << 20):
    pass
"#;
