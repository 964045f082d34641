//! Port sets as written in annotations and flags (`ambit_api::ports::PortSet`:
//! `25,587,3306,4000-4100`).
//!
//! Input: the text; its bytes also read as (first, last) pairs of ports for
//! `PortSet::from_ranges` (what discovery builds from the control plane's ranges).
//!
//! Invariants: no panic; a set that parses prints as text that parses back to the same
//! set; it contains exactly the ports of its ranges; a set built from ranges of real ports
//! (1-65535) prints and parses back to itself too.
#![no_main]

use ambit_api::ports::PortSet;
use libfuzzer_sys::fuzz_target;

/// Checks `set` against its own ranges and its printed form.
fn check(set: &PortSet) {
    let text = set.to_string();
    match text.parse::<PortSet>() {
        Ok(back) => assert_eq!(&back, set, "{text:?} parsed back differently"),
        Err(e) => panic!("{set:?} printed as {text:?}, which does not parse: {e}"),
    }
    for &(a, b) in set.ranges() {
        assert!(a <= b);
        assert!(set.contains(a) && set.contains(b));
        if a > 0 {
            let below = a - 1;
            let covered = set.ranges().iter().any(|&(x, y)| (x..=y).contains(&below));
            assert_eq!(set.contains(below), covered);
        }
    }
    assert_eq!(set.is_empty(), set.ranges().is_empty());
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(set) = text.parse::<PortSet>() {
            assert!(!set.contains(0), "{text:?} contains port 0");
            check(&set);
        }
    }
    let ranges = data.chunks_exact(4).map(|c| {
        let port = |a: u8, b: u8| u16::from_be_bytes([a, b]).max(1);
        (port(c[0], c[1]), port(c[2], c[3]))
    });
    check(&PortSet::from_ranges(ranges));
});
