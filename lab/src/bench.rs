//! `linkpilot-lab bench`: the highest rate of 1500-byte packets the delay line sustains in one
//! direction, and its scheduling error (actual minus intended delivery time), per offered rate.

use std::{
    net::UdpSocket,
    os::fd::AsRawFd,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    lab::{Lab, LabConfig},
    scenario::{Direction, Scenario},
};

/// One offered rate's result.
#[derive(Debug, Clone)]
pub struct Step {
    pub offered_mbps: f64,
    pub sent: u64,
    pub delay_line_in: u64,
    pub delay_line_out: u64,
    pub received: u64,
    pub sched_p50_us: f64,
    pub sched_p99_us: f64,
    pub sched_max_us: f64,
}

impl Step {
    /// Sustained: the delay line forwarded everything it was given and the receiver got at least
    /// 99% of what was sent.
    pub fn sustained(&self) -> bool {
        self.delay_line_out == self.delay_line_in && self.received as f64 >= 0.99 * self.sent as f64
    }
}

const PAYLOAD: usize = 1472; // + 8 UDP + 20 IPv4 = 1500-byte packets
const PORT: u16 = 9000;

/// Offers `mbps` of 1500-byte UDP packets from HK to US for `seconds` through a 10 ms link
/// without a bottleneck.
pub fn step(mbps: f64, seconds: u64) -> anyhow::Result<Step> {
    let scenario = Scenario::parse(
        "name = \"bench\"\n[[phase]]\nname = \"only\"\nduration = \"10min\"\n[phase.link]\ndelay = \"10ms\"\n",
        "<bench>",
        None,
    )?;
    let mut lab = Lab::start(LabConfig { name: "bench".into(), ..LabConfig::default() }, scenario)?;
    let (hk, us) = lab.hk_us();
    let dst = format!("{}:{PORT}", us.ipv4);
    let socket = us
        .spawn(move || -> std::io::Result<UdpSocket> {
            let s = UdpSocket::bind(("0.0.0.0", PORT))?;
            s.set_read_timeout(Some(Duration::from_millis(200)))?;
            force_rcvbuf(&s, 64 << 20);
            Ok(s)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("receiver setup panicked"))??;
    let done = Arc::new(AtomicBool::new(false));
    let done_rx = done.clone();
    let receiver = thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let mut n = 0u64;
        loop {
            match socket.recv(&mut buf) {
                Ok(_) => n += 1,
                Err(_) if done_rx.load(Ordering::Relaxed) => break n,
                Err(_) => {}
            }
        }
    });
    let duration = Duration::from_secs(seconds);
    let sent = hk
        .spawn(move || -> std::io::Result<u64> {
            let s = UdpSocket::bind("0.0.0.0:0")?;
            s.connect(&dst)?;
            let payload = [0x42u8; PAYLOAD];
            let pps = mbps * 1e6 / (1500.0 * 8.0);
            let start = Instant::now();
            let mut sent = 0u64;
            while start.elapsed() < duration {
                let due = (start.elapsed().as_secs_f64() * pps) as u64;
                while sent < due {
                    if s.send(&payload).is_ok() {
                        sent += 1;
                    } else {
                        break;
                    }
                }
                thread::sleep(Duration::from_micros(200));
            }
            Ok(sent)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    thread::sleep(Duration::from_millis(300)); // drain the 10 ms line
    done.store(true, Ordering::Relaxed);
    let received = receiver.join().map_err(|_| anyhow::anyhow!("receiver panicked"))?;
    let stats = lab.stats(Direction::HkToUs);
    let reports = lab.stop();
    let h = &reports.first().context("no delay-line report")?.sched_error;
    Ok(Step {
        offered_mbps: mbps,
        sent,
        delay_line_in: stats.packets_in,
        delay_line_out: stats.packets_out,
        received,
        sched_p50_us: h.value_at_quantile(0.5) as f64 / 1e3,
        sched_p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
        sched_max_us: h.max() as f64 / 1e3,
    })
}

fn force_rcvbuf(s: &UdpSocket, bytes: i32) {
    // SO_RCVBUFFORCE (root) rather than SO_RCVBUF, which net.core.rmem_max would cap; the
    // receiver must not be the bottleneck being measured.
    // SAFETY: setsockopt with a pointer to an int of the stated size.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        );
    }
}

/// Runs the offered rates in increasing order and prints a table.
pub fn run(seconds: u64) -> anyhow::Result<()> {
    println!(
        "{:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  sustained",
        "offered", "sent", "dl_in", "dl_out", "received", "p50_us", "p99_us", "max_us"
    );
    for mbps in [100.0, 250.0, 500.0, 750.0, 1000.0, 1250.0] {
        let s = step(mbps, seconds)?;
        println!(
            "{:>6.0}Mb/s {:>9} {:>9} {:>9} {:>9} {:>9.1} {:>9.1} {:>9.1}  {}",
            s.offered_mbps,
            s.sent,
            s.delay_line_in,
            s.delay_line_out,
            s.received,
            s.sched_p50_us,
            s.sched_p99_us,
            s.sched_max_us,
            if s.sustained() { "yes" } else { "no" }
        );
    }
    Ok(())
}
