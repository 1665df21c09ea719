//! The RTT of each burst's first segment, from a capture of one TCP flow: the time from the
//! first data segment sent after the flow fell idle to the first ACK that acknowledges any of
//! it. This is the sample the kernel takes for that ACK (it times the oldest segment an ACK
//! newly covers), measured here by tshark from the wire, outside the kernel and our programs.

use crate::sh;

/// A gap between data segments longer than this starts a burst.
const IDLE_S: f64 = 0.1;

/// (time of the ACK in Unix seconds, RTT in ms) of each burst's first segment in `pcap`, for
/// the flow whose receiving end has `port`. Bursts whose first segment was never acknowledged
/// in the capture are left out.
pub fn first_segment_rtts(pcap: &str, port: u16) -> Vec<(f64, f64)> {
    let filter = format!("tcp.port == {port}");
    let fields = sh(&[
        "tshark",
        "-r",
        pcap,
        "-Y",
        &filter,
        "-T",
        "fields",
        "-e",
        "frame.time_epoch",
        "-e",
        "tcp.dstport",
        "-e",
        "tcp.seq",
        "-e",
        "tcp.len",
        "-e",
        "tcp.ack",
    ]);
    parse(&fields, port)
}

/// [`first_segment_rtts`] from tshark's tab-separated fields: time, destination port,
/// relative sequence number, segment length, relative ACK number.
fn parse(fields: &str, port: u16) -> Vec<(f64, f64)> {
    let mut data_at = f64::NEG_INFINITY;
    // The first segment of the burst waiting for its ACK: (sent at, sequence number).
    let mut waiting: Option<(f64, u64)> = None;
    let mut out = Vec::new();
    for l in fields.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        let [at, dport, seq, len, ack] = f[..] else { continue };
        let (Ok(at), Ok(dport)) = (at.parse::<f64>(), dport.parse::<u16>()) else { continue };
        let num = |s: &str| s.parse::<u64>().unwrap_or(0);
        if dport == port && num(len) > 0 {
            if at - data_at > IDLE_S {
                waiting = Some((at, num(seq)));
            }
            data_at = at;
        } else if dport != port {
            if let Some((sent, _)) = waiting.filter(|&(_, seq)| num(ack) > seq) {
                out.push((at, (at - sent) * 1e3));
                waiting = None;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bursts_first_segment_is_timed_to_the_first_ack_that_covers_it() {
        let fields = "\
10.000\t6000\t1\t1448\t1
10.001\t6000\t1449\t1448\t1
10.021\t40000\t1\t0\t1
10.022\t40000\t1\t0\t2897
10.050\t6000\t2897\t1448\t1
10.090\t40000\t1\t0\t4345
10.400\t6000\t4345\t1448\t1
10.440\t40000\t1\t0\t5793
";
        // The pure ACK at 10.021 covers nothing new; the segment at 10.050 is no new burst.
        let got = parse(fields, 6000);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!((got[0].0 - 10.022).abs() < 1e-9 && (got[0].1 - 22.0).abs() < 1e-6, "{got:?}");
        assert!((got[1].0 - 10.440).abs() < 1e-9 && (got[1].1 - 40.0).abs() < 1e-6, "{got:?}");
    }
}
