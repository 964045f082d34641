//! Sets of ports as written in annotations: `25,587,3306,4000-4100`.

use std::fmt;
use std::str::FromStr;

/// Linkerd's default opaque ports: protocols where the server speaks first or that are
/// not worth detecting (SMTP, MySQL, Galera, PostgreSQL, Redis, Elasticsearch, memcached).
pub const DEFAULT_OPAQUE_PORTS: &str = "25,587,3306,4444,5432,6379,9300,11211";

/// A set of TCP ports, as inclusive ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PortSet {
    ranges: Vec<(u16, u16)>,
}

impl PortSet {
    /// The empty set.
    pub fn empty() -> Self {
        Self::default()
    }

    /// From inclusive ranges (each `first <= last`).
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u16, u16)>) -> Self {
        let mut ranges: Vec<_> = ranges
            .into_iter()
            .map(|(a, b)| (a.min(b), a.max(b)))
            .collect();
        ranges.sort_unstable();
        Self { ranges }
    }

    /// Whether `port` is in the set.
    pub fn contains(&self, port: u16) -> bool {
        self.ranges.iter().any(|(a, b)| (*a..=*b).contains(&port))
    }

    /// The ranges.
    pub fn ranges(&self) -> &[(u16, u16)] {
        &self.ranges
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl FromStr for PortSet {
    type Err = String;

    /// Parses comma-separated ports and ranges; spaces are allowed, an empty string is the
    /// empty set.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut ranges = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let port = |p: &str| -> Result<u16, String> {
                p.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| format!("{p:?} is not a port (1-65535)"))
            };
            let range = match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (port(a)?, port(b)?);
                    if a > b {
                        return Err(format!("range {part:?} runs backwards"));
                    }
                    (a, b)
                }
                None => {
                    let p = port(part)?;
                    (p, p)
                }
            };
            ranges.push(range);
        }
        Ok(Self::from_ranges(ranges))
    }
}

impl fmt::Display for PortSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (a, b)) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if a == b {
                write!(f, "{a}")?;
            } else {
                write!(f, "{a}-{b}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ports_and_ranges() {
        let s: PortSet = " 25, 4000-4100,3306 ".parse().unwrap();
        assert!(s.contains(25) && s.contains(4000) && s.contains(4100) && s.contains(3306));
        assert!(!s.contains(26) && !s.contains(4101));
        assert_eq!(s.to_string(), "25,3306,4000-4100");
        assert!("".parse::<PortSet>().unwrap().is_empty());
        let d: PortSet = DEFAULT_OPAQUE_PORTS.parse().unwrap();
        assert!(d.contains(5432) && !d.contains(80));
    }

    #[test]
    fn rejects_bad_ports() {
        for bad in ["0", "70000", "http", "10-5", "1-", "8080,x"] {
            assert!(bad.parse::<PortSet>().is_err(), "{bad} accepted");
        }
    }
}
