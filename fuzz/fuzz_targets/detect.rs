//! Protocol detection on a connection's first bytes (`ambit_proxy::proxy::classify`), fed
//! the way the proxy's read loop feeds it: classify after each read, stop at the first
//! answer, classify as finished at end of stream, never past the detection limit.
//!
//! Input: one byte saying how many of the next bytes are a read schedule (each the
//! length of one read, minus one), then the connection's bytes.
//!
//! Invariants: no panic; a finished stream always gets an answer; the answer does not
//! depend on how the bytes were cut into reads (one at a time, as scheduled, or 1 KiB at
//! a time as a fast client's would arrive).
#![no_main]

use ambit_fuzz::reads;
use ambit_proxy::proxy::{classify, Protocol};
use libfuzzer_sys::fuzz_target;

/// What the proxy reads at most before it decides (`proxy::detect::DETECT_LIMIT`).
const LIMIT: usize = 8 * 1024;
/// The proxy's read size.
const READ: usize = 1024;

/// The protocol detection settles on when `stream` arrives in `chunks` and then ends.
fn detect(chunks: &[&[u8]]) -> Protocol {
    let mut buf = Vec::new();
    for chunk in chunks {
        if let Some(p) = classify(&buf, false) {
            return p;
        }
        let room = LIMIT - buf.len();
        if room == 0 {
            break; // the proxy's read of zero bytes: as at end of stream
        }
        buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if chunk.len() > room {
            // The rest of the chunk is what the next read would get: cut the stream here
            // and let the loop classify the full buffer.
            return classify(&buf, false).unwrap_or_else(|| finished(&buf));
        }
    }
    classify(&buf, false).unwrap_or_else(|| finished(&buf))
}

/// The answer for a stream that ended (or hit the limit) after `buf`.
fn finished(buf: &[u8]) -> Protocol {
    match classify(buf, true) {
        Some(p) => p,
        None => panic!("no answer for a finished stream of {} bytes", buf.len()),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (schedule, stream) = rest.split_at(usize::from(n).min(rest.len()));
    let stream = &stream[..stream.len().min(LIMIT + READ)];

    for prefix in [&stream[..stream.len().min(64)], stream] {
        let _ = finished(prefix);
    }

    let whole = detect(&reads(stream, &[], READ));
    let scheduled = detect(&reads(stream, schedule, READ));
    assert_eq!(
        whole, scheduled,
        "read schedule {schedule:?} changed the answer"
    );
    // A byte at a time is quadratic: only for the first kilobyte.
    let short = &stream[..stream.len().min(READ)];
    let bytes: Vec<&[u8]> = short.chunks(1).collect();
    assert_eq!(
        detect(&reads(short, &[], READ)),
        detect(&bytes),
        "a byte at a time changed the answer"
    );
});
