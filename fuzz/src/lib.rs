//! Helpers the fuzz targets share (`fuzz_targets/*.rs`); docs/FUZZING.md says what each
//! target feeds and which invariants it checks.
//!
//! # Layout
//!
//! - [`reads`]: cutting an input into the reads a socket would deliver.
//! - [`messages`]: an input as a sequence of length-delimited protobuf messages.
//! - [`quiet_stderr`]: running code that logs to stderr without flooding the fuzzer.
//! - [`cluster`]: the fixed cluster the policy-objects target adds its objects to.
//! - [`regexes`]: the regular expressions a policy update carries.

pub mod cluster;
pub mod regexes;

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Once;

/// Cuts `data` into reads: each length is taken from `schedule` in turn (a byte of it
/// plus one, so never empty), up to `max` bytes a read; once `schedule` is used up, the
/// rest goes `max` bytes at a time.
pub fn reads<'a>(data: &'a [u8], schedule: &'a [u8], max: usize) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut lengths = schedule.iter().map(|b| usize::from(*b) + 1);
    while !rest.is_empty() {
        let n = lengths.next().unwrap_or(max).min(max).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        out.push(chunk);
        rest = tail;
    }
    out
}

/// Decodes `data` as up to `max` length-delimited messages (a varint length, then the
/// message), stopping at the first that does not decode.
pub fn messages<M: prost::Message + Default>(mut data: &[u8], max: usize) -> Vec<M> {
    let mut out = Vec::new();
    while !data.is_empty() && out.len() < max {
        match M::decode_length_delimited(&mut data) {
            Ok(m) => out.push(m),
            Err(_) => break,
        }
    }
    out
}

/// The saved stderr while [`quiet_stderr`] runs (-1 otherwise).
static SAVED_STDERR: AtomicI32 = AtomicI32::new(-1);
/// Installs the panic hook that puts stderr back before the message is printed.
static HOOK: Once = Once::new();

/// Runs `f` with stderr pointed at /dev/null (code that logs every error it returns would
/// otherwise bury the fuzzer's own output), then puts stderr back. A panic inside `f`
/// puts stderr back first, so its message and libFuzzer's report are seen as usual.
pub fn quiet_stderr<T>(f: impl FnOnce() -> T) -> T {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_stderr();
            previous(info);
        }));
    });
    #[allow(unsafe_code)]
    // SAFETY: plain descriptor calls on descriptors this function opens itself; fd 2 is
    // restored by `restore_stderr` before returning or panicking.
    unsafe {
        let saved = libc::dup(2);
        if saved < 0 {
            return f();
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if null < 0 {
            libc::close(saved);
            return f();
        }
        libc::dup2(null, 2);
        libc::close(null);
        SAVED_STDERR.store(saved, Ordering::SeqCst);
    }
    let out = f();
    restore_stderr();
    out
}

/// Puts back the stderr [`quiet_stderr`] saved, if it saved one.
fn restore_stderr() {
    let saved = SAVED_STDERR.swap(-1, Ordering::SeqCst);
    if saved >= 0 {
        #[allow(unsafe_code)]
        // SAFETY: `saved` is the duplicate of fd 2 that quiet_stderr made and nothing
        // else closes.
        unsafe {
            libc::dup2(saved, 2);
            libc::close(saved);
        }
    }
}
