//! `ambit-cni`: run by the container runtime as a chained CNI plugin (no arguments, the
//! `CNI_*` environment and the configuration on stdin), or as `ambit-cni install` /
//! `ambit-cni uninstall` by its DaemonSet.

fn main() {
    std::process::exit(ambit_cni::main());
}
