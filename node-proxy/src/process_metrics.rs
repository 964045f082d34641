//! The process's own metrics, read from `/proc/self` at each scrape, with the names the
//! Prometheus client libraries (and Linkerd's proxy) use: `process_cpu_seconds_total`,
//! `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`,
//! `process_threads`, `process_start_time_seconds`. `process_max_fds` is the limit the
//! proxy raised at start (`limits.rs`). The node-proxy dashboard reads them.

use std::fmt::Error;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// What `/proc/self/stat` says, in the units the metrics use.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// User plus system CPU time.
    pub cpu_seconds: f64,
    /// Virtual memory size.
    pub virtual_bytes: u64,
    /// Resident set size.
    pub resident_bytes: u64,
    /// Threads.
    pub threads: u64,
    /// Start time, seconds after boot.
    pub start_after_boot: f64,
}

/// Parses `/proc/<pid>/stat` (proc(5)): fields after the command, which is in
/// parentheses and may hold spaces and parentheses itself, so the last `)` ends it.
pub fn parse_stat(stat: &str, ticks_per_second: f64, page_size: u64) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is rest's first.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<&str> { f.get(n - 3).copied() };
    let num = |n: usize| -> Option<u64> { field(n)?.parse().ok() };
    let (utime, stime) = (num(14)?, num(15)?);
    Some(Stat {
        cpu_seconds: (utime + stime) as f64 / ticks_per_second,
        virtual_bytes: num(23)?,
        resident_bytes: num(24)?.saturating_mul(page_size),
        threads: num(20)?,
        start_after_boot: num(22)? as f64 / ticks_per_second,
    })
}

/// The boot time, seconds since the epoch, from `/proc/stat`'s `btime`.
pub fn parse_boot_time(proc_stat: &str) -> Option<u64> {
    proc_stat
        .lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Reads `/proc/self` at each scrape.
#[derive(Debug)]
struct Process {
    ticks_per_second: f64,
    page_size: u64,
    boot_time: Option<u64>,
}

fn sysconf(name: libc::c_int, default: i64) -> i64 {
    // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
    #[allow(unsafe_code)]
    let v = unsafe { libc::sysconf(name) };
    if v > 0 {
        v
    } else {
        default
    }
}

impl Collector for Process {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), Error> {
        // A /proc that cannot be read (it always can on Linux) leaves the series out
        // rather than failing the whole scrape.
        let Some(stat) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .and_then(|s| parse_stat(&s, self.ticks_per_second, self.page_size))
        else {
            return Ok(());
        };
        let cpu = ConstCounter::new(stat.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                stat.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                stat.virtual_bytes,
            ),
            (
                "process_threads",
                "Number of OS threads in the process",
                stat.threads,
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            // The directory's own descriptor is among them while it is read.
            let open = fds.count().saturating_sub(1);
            let g = ConstGauge::new(i64::try_from(open).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Some(boot) = self.boot_time {
            let g = ConstGauge::new(boot as f64 + stat.start_after_boot);
            g.encode(encoder.encode_descriptor(
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// Registers the process collector.
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(Process {
        ticks_per_second: sysconf(libc::_SC_CLK_TCK, 100) as f64,
        page_size: u64::try_from(sysconf(libc::_SC_PAGESIZE, 4096)).unwrap_or(4096),
        boot_time: std::fs::read_to_string("/proc/stat")
            .ok()
            .as_deref()
            .and_then(parse_boot_time),
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_whose_command_holds_spaces_and_parentheses_parses() {
        // proc(5): pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
        // majflt cmajflt utime stime cutime cstime priority nice num_threads itrealvalue
        // starttime vsize rss ...
        let line = "4242 (ambit (x) proxy) S 1 4242 4242 0 -1 4194560 900 0 0 0 \
                    250 50 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615";
        let s = parse_stat(line, 100.0, 4096).unwrap();
        assert_eq!(
            s,
            Stat {
                cpu_seconds: 3.0,
                virtual_bytes: 104_857_600,
                resident_bytes: 2560 * 4096,
                threads: 7,
                start_after_boot: 123.45,
            }
        );
        assert_eq!(parse_stat("garbage", 100.0, 4096), None);
        assert_eq!(parse_stat("1 (x) S 1 2", 100.0, 4096), None);
    }

    #[test]
    fn the_boot_time_is_proc_stats_btime() {
        assert_eq!(
            parse_boot_time("cpu  1 2 3\nbtime 1764000000\nprocesses 9\n"),
            Some(1_764_000_000)
        );
        assert_eq!(parse_boot_time("cpu 1\n"), None);
    }

    #[test]
    fn a_scrape_has_this_process_s_series() {
        let mut r = Registry::default();
        register(&mut r);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &r).unwrap();
        let value = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} in:\n{text}"))
                .parse()
                .unwrap()
        };
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(value("process_cpu_seconds_total") >= 0.0);
        assert!(value("process_resident_memory_bytes") > 0.0);
        assert!(value("process_virtual_memory_bytes") >= value("process_resident_memory_bytes"));
        assert!(value("process_threads") >= 1.0);
        // This test's own descriptors: at least stdin/stdout/stderr.
        assert!(value("process_open_fds") >= 3.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let start = value("process_start_time_seconds");
        assert!(
            start <= now + 1.0 && start > now - 86_400.0 * 365.0,
            "{start}"
        );
    }
}
