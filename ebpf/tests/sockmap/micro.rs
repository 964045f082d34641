//! What sockmap saves in the kernel alone, without a proxy: one paired outbound hop, 1 KiB
//! ping-pong and a 512 MiB stream, sockmap off then on (budget lifted), twice; prints
//! wall time and this process's CPU (both ends are its threads). Not a check:
//! `cargo test -p ambit-ebpf --test sockmap -- --ignored --nocapture` (BENCHMARKS.md).

use crate::lab::*;
use std::io::{Read, Write};
use std::time::Instant;

/// This process's user + system CPU seconds.
fn cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').unwrap().1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // /proc counts in USER_HZ, 100 on Linux whatever the kernel's HZ.
    ticks / 100.0
}

#[test]
#[ignore = "a measurement, not a check"]
fn sockmap_against_tcp_on_one_hop() {
    const ROUND_TRIPS: u32 = 50_000;
    const STREAM: usize = 512 << 20;
    for round in 1..=2 {
        for on in [false, true] {
            let mut lab = Lab::new("micro", on);
            if on {
                lab.r.set_sockmap_budget(u32::MAX).unwrap();
            }
            let (mut app, mut proxy) = lab.outbound_hop();
            let echo = std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                for _ in 0..ROUND_TRIPS {
                    proxy.read_exact(&mut buf).unwrap();
                    proxy.write_all(&buf).unwrap();
                }
            });
            let (c0, t0) = (cpu(), Instant::now());
            let mut buf = [7u8; 1024];
            for _ in 0..ROUND_TRIPS {
                app.write_all(&buf).unwrap();
                app.read_exact(&mut buf).unwrap();
            }
            echo.join().unwrap();
            let per = |x: f64| x * 1e6 / f64::from(ROUND_TRIPS);
            eprintln!(
                "round {round}, sockmap {on}: 1 KiB ping-pong {:.1} µs a round trip, {:.1} µs CPU",
                per(t0.elapsed().as_secs_f64()),
                per(cpu() - c0)
            );
            let (mut app, mut proxy) = lab.outbound_hop();
            let reader = std::thread::spawn(move || {
                let mut b = vec![0u8; 1 << 16];
                let mut got = 0;
                while got < STREAM {
                    got += proxy.read(&mut b).unwrap();
                }
            });
            let (c0, t0) = (cpu(), Instant::now());
            let chunk = vec![1u8; 1 << 16];
            for _ in 0..STREAM / chunk.len() {
                app.write_all(&chunk).unwrap();
            }
            reader.join().unwrap();
            let gb = STREAM as f64 / 1e9;
            eprintln!(
                "round {round}, sockmap {on}: 512 MiB stream {:.1} Gbit/s, {:.3} CPU-s per GB",
                gb * 8.0 / t0.elapsed().as_secs_f64(),
                (cpu() - c0) / gb
            );
        }
    }
}
