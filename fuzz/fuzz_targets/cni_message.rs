//! The CNI socket's messages (`ambit_api::cni`): what the node proxy reads from the unix
//! socket (a `Request`, read in pieces as they arrive) and what the plugin reads back (a
//! `Response`).
//!
//! Input: one byte saying how many of the next bytes are a read schedule, then the bytes
//! on the socket.
//!
//! Invariants: no panic; a frame decodes the same however it was cut into reads (the
//! proxy retries `decode` after every read); a decoded message encodes and decodes back
//! to itself; a pod reference that validates is safe as a file name (the proxy keeps a
//! record and a netns handle per pod under its run directory).
#![no_main]

use ambit_api::cni::{decode, encode, FrameError, PodRef, Request, Response, MAX_MESSAGE};
use ambit_fuzz::reads;
use libfuzzer_sys::fuzz_target;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;

/// What the reader ends with: a message, an error, or nothing yet (stream ended first).
fn read_in<T: DeserializeOwned>(chunks: &[&[u8]]) -> Option<Result<T, String>> {
    let mut buf = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        match decode::<T>(&buf) {
            Ok(Some(m)) => return Some(Ok(m)),
            Ok(None) => {}
            Err(e) => return Some(Err(e.to_string())),
        }
    }
    None
}

/// Checks the round trip of a decoded message.
fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(m: &T) {
    match encode(m) {
        Ok(bytes) => {
            let back = decode::<T>(&bytes).map_err(|e| e.to_string());
            assert!(
                matches!(&back, Ok(Some(b)) if b == m),
                "{m:?} came back as {back:?}"
            );
        }
        // Re-encoding may add defaulted fields to a message near the size limit.
        Err(FrameError::TooLong(n)) => assert!(n > MAX_MESSAGE - 64, "{n} bytes"),
        Err(e) => panic!("{m:?} does not encode: {e}"),
    }
}

/// Checks that a reference the proxy accepts cannot name a path outside its directory.
fn check_pod(pod: &PodRef) {
    if pod.validate().is_ok() {
        for name in [&pod.namespace, &pod.name, &pod.container_id] {
            assert!(!name.is_empty() && !name.contains('/') && !name.contains('\0'));
            assert!(name != "." && name != "..", "{pod:?}");
        }
    }
}

fn check<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    data: &[u8],
    schedule: &[u8],
) -> Option<Result<T, String>> {
    let whole = read_in::<T>(&[data]);
    let pieces = read_in::<T>(&reads(data, schedule, 8192));
    match (&whole, &pieces) {
        (Some(Ok(a)), Some(Ok(b))) => assert_eq!(a, b),
        (Some(Err(_)), Some(Err(_))) | (None, None) => {}
        // Read in pieces, a frame is complete as soon as its bytes are: a whole read may
        // only differ by having seen the same frame.
        _ => panic!("read whole: {whole:?}; read in pieces: {pieces:?}"),
    }
    if let Some(Ok(m)) = &whole {
        round_trip(m);
    }
    whole
}

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let (schedule, bytes) = rest.split_at(usize::from(n).min(rest.len()));
    if let Some(Ok(request)) = check::<Request>(bytes, schedule) {
        match &request {
            Request::Add(add) => check_pod(&add.pod),
            Request::Del(pod) | Request::Check(pod) => check_pod(pod),
            Request::Status | Request::Gc { .. } => {}
        }
    }
    let _ = check::<Response>(bytes, schedule);
});
