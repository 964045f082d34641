# syntax=docker/dockerfile:1
# The images the Helm chart names, one target each:
#
#   docker build --target control -t ghcr.io/ambit-mesh/ambit-control:0.1.0 .
#   docker build --target proxy   -t ghcr.io/ambit-mesh/ambit-proxy:0.1.0 .
#   docker build --target cni     -t ghcr.io/ambit-mesh/ambit-cni:0.1.0 .
#
# Never built on the development machines yet (issue 25: no container engine so far);
# scripts/check-dockerfile.sh, run by scripts/test.sh, checks that every path copied
# exists, that the build stage copies what cargo needs (every workspace member, every
# path dependency and [patch] source, the files the manifest names), and that every
# binary copied is one the workspace builds.

FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler cmake clang \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock clippy.toml ./
COPY api api
COPY serving serving
COPY control control
COPY node-proxy node-proxy
COPY ebpf ebpf
COPY init-cni init-cni
COPY cli cli
COPY topology topology
COPY tests tests
COPY bench bench
# aya 0.13.1 with one change, patched in by the workspace's [patch.crates-io].
COPY vendor vendor
COPY scripts scripts
# The eBPF programs: nightly rust-src and bpf-linker (ebpf/build.rs compiles them).
RUN ./scripts/install-bpf-toolchain.sh
RUN cargo build --release --locked -p ambit-control -p ambit-proxy -p ambit-cni -p ambit-cli

FROM debian:12-slim AS base
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*

FROM base AS control
COPY --from=build /src/target/release/ambit-control /usr/local/bin/ambit-control
COPY --from=build /src/target/release/ambit /usr/local/bin/ambit
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ambit-control"]

FROM base AS proxy
# nftables: the fallback redirection where the kernel refuses the eBPF programs.
RUN apt-get update \
 && apt-get install -y --no-install-recommends nftables iproute2 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/ambit-proxy /usr/local/bin/ambit-proxy
ENTRYPOINT ["/usr/local/bin/ambit-proxy"]

FROM base AS cni
# The installer copies this same binary into the host's CNI bin directory, where the
# runtime runs it as the chained plugin.
COPY --from=build /src/target/release/ambit-cni /usr/local/bin/ambit-cni
ENTRYPOINT ["/usr/local/bin/ambit-cni"]
