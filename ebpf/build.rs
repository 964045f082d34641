//! Builds the eBPF programs (`ebpf/programs`, no_std, `bpfel-unknown-none`) with the nightly
//! toolchain and bpf-linker, so that the loader can embed the object. The toolchain is
//! installed by `scripts/install-bpf-toolchain.sh` (the test script runs it).
//!
//! `AMBIT_EBPF_OBJECT=<path>` embeds an object built elsewhere instead.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default());
    let object = out.join("ambit-redirect.o");
    for path in [
        "programs/src",
        "programs/Cargo.toml",
        "programs/Cargo.lock",
        "common/src",
    ] {
        println!("cargo:rerun-if-changed={}", manifest.join(path).display());
    }
    println!("cargo:rerun-if-env-changed=AMBIT_EBPF_OBJECT");
    if let Some(prebuilt) = std::env::var_os("AMBIT_EBPF_OBJECT") {
        if let Err(e) = std::fs::copy(&prebuilt, &object) {
            panic!(
                "AMBIT_EBPF_OBJECT={}: {e}",
                PathBuf::from(prebuilt).display()
            );
        }
        return;
    }
    let target_dir = out.join("bpf-target");
    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", "nightly", "cargo", "build", "--release", "--locked"])
        .args(["-Z", "build-std=core", "--target", "bpfel-unknown-none"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(manifest.join("programs"));
    // The outer cargo's settings (its rustc, flags, toolchain) are not the nightly's.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if (key.starts_with("CARGO") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || key == "RUSTFLAGS"
            || key == "RUSTUP_TOOLCHAIN"
        {
            cargo.env_remove(&key);
        }
    }
    let status = cargo.status();
    match status {
        Ok(s) if s.success() => {}
        other => panic!(
            "building the eBPF programs failed ({other:?}); they need the nightly toolchain \
             with rust-src and bpf-linker: run ./scripts/install-bpf-toolchain.sh"
        ),
    }
    let built = target_dir.join("bpfel-unknown-none/release/ambit-redirect");
    if let Err(e) = std::fs::copy(&built, &object) {
        panic!("copying {}: {e}", built.display());
    }
}
