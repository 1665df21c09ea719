//! Traffic for the measurements: namespaces of our own, iperf3, and a TCP echo server with
//! request/response and connect/close clients (threads that enter the namespace).

use std::{
    fs,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use nix::sched::{setns, CloneFlags};
use serde_json::Value;

use crate::lab::Reaped;

/// Namespaces deleted on drop, so every exit path removes them (and what lives in them).
pub struct Netns(Vec<String>);

impl Netns {
    pub fn create(names: &[&str]) -> anyhow::Result<Self> {
        // The guard first: whatever fails below, the namespaces go.
        let guard = Self(names.iter().map(|n| (*n).to_owned()).collect());
        for ns in names {
            let _ = Command::new("ip").args(["netns", "del", ns]).stderr(Stdio::null()).status();
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(guard)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in &self.0 {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

pub fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().context("running ip")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

pub fn in_ns(netns: &str, program: &str) -> Command {
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{netns}")).arg(program);
    c
}

/// Runs `f` on a thread inside `netns`: sockets it opens live there.
pub fn in_netns<T: Send + 'static>(
    netns: &str,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    let path = format!("/run/netns/{netns}");
    thread::spawn(move || {
        let fd = fs::File::open(&path).with_context(|| format!("opening {path}"))?;
        setns(fd, CloneFlags::CLONE_NEWNET).with_context(|| format!("entering {path}"))?;
        f()
    })
    .join()
    .map_err(|_| anyhow::anyhow!("a traffic thread panicked"))?
}

/// `iperf3 -s` bound to `addr` in `netns` with `extra` arguments (CPU affinity), once it
/// listens.
pub fn iperf_server(netns: &str, addr: &str, extra: &[&str]) -> anyhow::Result<Reaped> {
    let child = in_ns(netns, "iperf3")
        .args(["-s", "-B", addr, "-p", "5201"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -s")?;
    let server = Reaped(child, "iperf3 -s");
    let t = Instant::now();
    loop {
        let out = in_ns(netns, "ss").args(["-Hltn", "sport = :5201"]).output()?;
        if !out.stdout.is_empty() {
            return Ok(server);
        }
        if t.elapsed() > Duration::from_secs(10) {
            bail!("iperf3 -s in {netns} did not listen within 10 s");
        }
        thread::sleep(Duration::from_millis(100));
    }
}

/// An iperf3 client run in `netns` (`-J` added): its JSON, or its error. Killed past
/// `secs` + 30 s.
pub fn iperf_client(netns: &str, args: &[&str], secs: u64) -> anyhow::Result<Value> {
    let mut child = in_ns(netns, "iperf3")
        .args(args)
        .arg("-J")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting iperf3 -c")?;
    let mut stdout = child.stdout.take().context("iperf3's stdout")?;
    let reader = thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let mut client = Reaped(child, "iperf3 -c");
    if client.wait_until(Instant::now() + Duration::from_secs(secs + 30)).is_none() {
        bail!("iperf3 {} did not finish within {} s", args.join(" "), secs + 30);
    }
    let text = reader.join().unwrap_or_default();
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("iperf3 {} printed no JSON", args.join(" ")))?;
    if let Some(e) = v["error"].as_str() {
        bail!("iperf3 {}: {e}", args.join(" "));
    }
    Ok(v)
}

pub fn num(v: &Value, path: &[&str]) -> anyhow::Result<f64> {
    let mut x = v;
    for p in path {
        x = &x[*p];
    }
    x.as_f64().with_context(|| format!("iperf3's JSON lacks {}", path.join(".")))
}

/// TCP echo listeners in a namespace: `rr` echoes until the client closes, `crr` answers one
/// byte per connection. Stopped on drop.
pub struct EchoServer {
    netns: String,
    pub rr: SocketAddr,
    pub crr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl EchoServer {
    pub fn start(netns: &str, ip: &str) -> anyhow::Result<Self> {
        let rr: SocketAddr = format!("{ip}:7000").parse()?;
        let crr: SocketAddr = format!("{ip}:7001").parse()?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (addr, per_conn) in [(rr, echo_all as fn(TcpStream)), (crr, echo_one)] {
            let (tx, rx) = mpsc::channel();
            let (path, stop) = (format!("/run/netns/{netns}"), stop.clone());
            threads.push(thread::spawn(move || {
                let listener = fs::File::open(&path)
                    .map_err(anyhow::Error::from)
                    .and_then(|fd| Ok(setns(fd, CloneFlags::CLONE_NEWNET)?))
                    .and_then(|()| Ok(TcpListener::bind(addr)?));
                let listener = match listener {
                    Ok(l) => {
                        let _ = tx.send(Ok(()));
                        l
                    }
                    Err(e) => return drop(tx.send(Err(e))),
                };
                for conn in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let _ = conn.set_nodelay(true);
                    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                    if addr == rr {
                        thread::spawn(move || per_conn(conn));
                    } else {
                        per_conn(conn);
                    }
                }
            }));
            rx.recv().context("echo server thread")?.context("echo server")?;
        }
        Ok(Self { netns: netns.to_owned(), rr, crr, stop, threads })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A connection wakes each blocked accept, which then sees the flag.
        let addrs = [self.rr, self.crr];
        let _ = in_netns(&self.netns, move || {
            for a in addrs {
                let _ = TcpStream::connect_timeout(&a, Duration::from_secs(1));
            }
            Ok(())
        });
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn echo_all(mut c: TcpStream) {
    let mut buf = [0u8; 64];
    while let Ok(n @ 1..) = c.read(&mut buf) {
        if c.write_all(&buf[..n]).is_err() {
            break;
        }
    }
}

fn echo_one(mut c: TcpStream) {
    let mut b = [0u8; 1];
    if c.read_exact(&mut b).is_ok() && c.write_all(&b).is_ok() {
        // Wait for the client's close, so the client ends up with the TIME_WAIT.
        let _ = c.read(&mut b);
    }
}

/// 1-byte request/response over one connection for `secs`: (transactions, seconds).
pub fn request_response(netns: &str, addr: SocketAddr, secs: u64) -> anyhow::Result<(u64, f64)> {
    in_netns(netns, move || {
        let mut c = TcpStream::connect(addr).context("connecting to the echo server")?;
        c.set_nodelay(true)?;
        c.set_read_timeout(Some(Duration::from_secs(5)))?;
        let (t, end) = (Instant::now(), Duration::from_secs(secs));
        let (mut n, mut b) = (0u64, [7u8; 1]);
        while t.elapsed() < end {
            c.write_all(&b)?;
            c.read_exact(&mut b).context("echo")?;
            n += 1;
        }
        Ok((n, t.elapsed().as_secs_f64()))
    })
}

/// Connect, 1-byte request/response, close, for `secs`: (connections, seconds).
pub fn connect_close(netns: &str, addr: SocketAddr, secs: u64) -> anyhow::Result<(u64, f64)> {
    in_netns(netns, move || {
        let (t, end) = (Instant::now(), Duration::from_secs(secs));
        let (mut n, mut b) = (0u64, [7u8; 1]);
        while t.elapsed() < end {
            let mut c = TcpStream::connect(addr)
                .with_context(|| format!("connect failed after {n} connections"))?;
            c.set_nodelay(true)?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            c.write_all(&b)?;
            c.read_exact(&mut b).context("echo")?;
            n += 1;
        }
        Ok((n, t.elapsed().as_secs_f64()))
    })
}
