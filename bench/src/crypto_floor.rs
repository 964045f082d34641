//! The cryptographic floor of an mTLS mesh: what sealing and opening every byte once costs
//! with the cipher the proxies negotiate (TLS 1.3 `TLS13_AES_128_GCM_SHA256`, aws-lc-rs, as
//! `ambit_proxy::tls::provider()` prefers it), in CPU-seconds per GB.
//!
//! ```sh
//! cargo build --release -p ambit-bench
//! target/release/crypto-floor --gb 2          # one JSON line on stdout
//! ```
//!
//! Records are the TLS 1.3 maximum (16 KiB of plaintext, the content type byte and the
//! 16-byte tag), sealed and opened in place with the record header as associated data and
//! a nonce per record, as rustls does. Time is the thread's own time on a CPU
//! (`/proc/thread-self/schedstat`), so another process on the machine does not count; a
//! warm-up pass runs before the clock starts. `bench/mesh/run.sh` runs it in every round
//! and `summarize.py` adds it to the two plain relays' cost: the floor the mesh is measured
//! against ("relays + seal + open").

use anyhow::Context;
use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_128_GCM, NONCE_LEN};
use clap::Parser;

#[derive(Debug, Parser)]
struct Args {
    /// Gigabytes (10^9 bytes) of plaintext to seal, then to open.
    #[arg(long, default_value_t = 2.0)]
    gb: f64,
}

/// TLS 1.3's largest record: 2^14 bytes of plaintext and one byte of content type.
const RECORD: usize = 16 * 1024 + 1;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let key_bytes = [0x42u8; 16];
    let key = LessSafeKey::new(
        UnboundKey::new(&AES_128_GCM, &key_bytes).map_err(|_| anyhow::anyhow!("AES-128 key"))?,
    );
    // Batches of records in buffers of their own, each sealed then opened in place, so
    // that the clock is read once per batch, not per record.
    const BATCH: u64 = 256;
    let batches = ((args.gb * 1e9) / ((RECORD - 1) as f64 * BATCH as f64)).ceil() as u64;
    let records = batches * BATCH;
    let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0x5au8; RECORD]).collect();
    let mut tags = Vec::with_capacity(BATCH as usize);

    let mut pass = |seq0: u64, seal_ns: &mut u64, open_ns: &mut u64| -> anyhow::Result<()> {
        tags.clear();
        let a = cpu_ns()?;
        for (i, buf) in bufs.iter_mut().enumerate() {
            tags.push(seal(&key, seq0 + i as u64, buf)?);
        }
        let b = cpu_ns()?;
        for (i, (buf, tag)) in bufs.iter_mut().zip(&tags).enumerate() {
            open(&key, seq0 + i as u64, buf, tag)?;
        }
        let c = cpu_ns()?;
        *seal_ns += b - a;
        *open_ns += c - b;
        Ok(())
    };
    // Warm-up: the CPU's frequency, the key schedule, the pages of the buffers.
    let (mut seal_ns, mut open_ns) = (0u64, 0u64);
    for batch in 0..20 {
        pass(batch * BATCH, &mut seal_ns, &mut open_ns)?;
    }
    let (mut seal_ns, mut open_ns) = (0u64, 0u64);
    for batch in 0..batches {
        pass(batch * BATCH, &mut seal_ns, &mut open_ns)?;
    }
    let bytes = records as f64 * (RECORD - 1) as f64;
    let per_gb = |ns: u64| ns as f64 / 1e9 / (bytes / 1e9);
    let seal_s = per_gb(seal_ns);
    let open_s = per_gb(open_ns);
    let report = serde_json::json!({
        "cipher": "TLS13_AES_128_GCM_SHA256 (aws-lc-rs)",
        "record_bytes": RECORD - 1,
        "gb": bytes / 1e9,
        "seal_cpu_s_per_gb": seal_s,
        "open_cpu_s_per_gb": open_s,
        "seal_gb_per_s": 1.0 / seal_s,
        "open_gb_per_s": 1.0 / open_s,
    });
    println!("{report}");
    Ok(())
}

fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

/// The TLS 1.3 record header of a record of `len` ciphertext bytes: the associated data.
fn header(len: usize) -> [u8; 5] {
    let [hi, lo] = (len as u16).to_be_bytes();
    [0x17, 0x03, 0x03, hi, lo]
}

fn seal(key: &LessSafeKey, seq: u64, buf: &mut [u8]) -> anyhow::Result<aws_lc_rs::aead::Tag> {
    key.seal_in_place_separate_tag(nonce(seq), Aad::from(header(buf.len() + 16)), buf)
        .map_err(|_| anyhow::anyhow!("seal"))
}

fn open(
    key: &LessSafeKey,
    seq: u64,
    buf: &mut [u8],
    tag: &aws_lc_rs::aead::Tag,
) -> anyhow::Result<()> {
    key.open_in_place_separate_tag(
        nonce(seq),
        Aad::from(header(buf.len() + 16)),
        tag.as_ref(),
        buf,
    )
    .map_err(|_| anyhow::anyhow!("open: record {seq} does not authenticate"))?;
    Ok(())
}

/// Nanoseconds this thread has run on a CPU.
fn cpu_ns() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .context("reading /proc/thread-self/schedstat")?;
    text.split_whitespace()
        .next()
        .and_then(|f| f.parse().ok())
        .context("parsing /proc/thread-self/schedstat")
}
