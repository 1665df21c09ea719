//! A process's CPU time and memory as the kernel keeps them (`/proc/PID/stat`, `/proc/PID/status`,
//! read by procfs-core), for the runs that watch the daemon (`bench-daemon`, `soak`).

use anyhow::Context as _;
use procfs_core::{
    process::{Stat, Status},
    FromRead as _,
};

/// CLK_TCK, the unit of `/proc/PID/stat`'s CPU times: 100 on every Linux configuration this runs
/// on.
const TICKS_PER_S: f64 = 100.0;

/// One reading of a process.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    /// User and system CPU time since it started, s.
    pub cpu_s: f64,
    /// Resident memory now and at its peak, KiB.
    pub rss_kib: u64,
    pub peak_rss_kib: u64,
}

pub fn usage(pid: u32) -> anyhow::Result<Usage> {
    let stat = Stat::from_file(format!("/proc/{pid}/stat")).context("/proc/PID/stat")?;
    let status = Status::from_file(format!("/proc/{pid}/status")).context("/proc/PID/status")?;
    Ok(Usage {
        cpu_s: (stat.utime + stat.stime) as f64 / TICKS_PER_S,
        rss_kib: status.vmrss.context("/proc/PID/status has no VmRSS")?,
        peak_rss_kib: status.vmhwm.context("/proc/PID/status has no VmHWM")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_time_is_the_kernels_process_clock_and_memory_is_resident() {
        use nix::time::{clock_gettime, ClockId};
        let cpu = || {
            let t = clock_gettime(ClockId::CLOCK_PROCESS_CPUTIME_ID).unwrap();
            t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9
        };
        // Spin until the process has used 0.2 s of CPU, whatever else the machine runs.
        while cpu() < 0.2 {
            std::hint::black_box(0);
        }
        let u = usage(std::process::id()).unwrap();
        let clock = cpu();
        // /proc's user and system times are the same clock split in two, each cut to whole ticks
        // (10 ms).
        assert!(u.cpu_s >= 0.18 && u.cpu_s <= clock, "{u:?} against {clock} s");
        assert!(u.rss_kib > 0 && u.peak_rss_kib >= u.rss_kib, "{u:?}");
    }
}
