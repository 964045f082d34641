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
    install_toolchain(&manifest);
    let target_dir = out.join("bpf-target");
    let mut cargo = Command::new("rustup");
    cargo
        .args(["run", "nightly", "cargo", "build", "--release", "--locked"])
        .args(["-Z", "build-std=core", "--target", "bpfel-unknown-none"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(manifest.join("programs"));
    clean_env(&mut cargo);
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

/// Installs the nightly rust-src and bpf-linker when bpf-linker is missing, with the same
/// idempotent script the test command runs (so a plain `cargo build` works on a fresh
/// machine too).
fn install_toolchain(manifest: &std::path::Path) {
    let found = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| dir.join("bpf-linker").is_file())
    }) || std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .is_some_and(|home| home.join("bin/bpf-linker").is_file());
    if found {
        return;
    }
    let script = manifest.join("../scripts/install-bpf-toolchain.sh");
    println!(
        "cargo:warning=bpf-linker not found; running {}",
        script.display()
    );
    let mut cmd = Command::new("bash");
    cmd.arg(&script);
    clean_env(&mut cmd);
    match cmd.status() {
        Ok(s) if s.success() => {}
        other => panic!(
            "installing the eBPF toolchain failed ({other:?}); run {} by hand",
            script.display()
        ),
    }
}

/// Removes the outer cargo's settings (its rustc, flags, toolchain): they are not the
/// nightly's.
fn clean_env(cmd: &mut Command) {
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if (key.starts_with("CARGO") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTDOC")
            || key == "RUSTFLAGS"
            || key == "RUSTUP_TOOLCHAIN"
        {
            cmd.env_remove(&key);
        }
    }
}
