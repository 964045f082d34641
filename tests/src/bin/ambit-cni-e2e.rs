//! `ambit-cni`, built inside the end-to-end crate so that its tests can run it.

fn main() {
    std::process::exit(ambit_cni::main());
}
