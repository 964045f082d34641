# syntax=docker/dockerfile:1
# The images the Helm chart names, one target each:
#
#   docker build --target control -t ghcr.io/ambit-mesh/ambit-control:0.1.0 .
#   docker build --target proxy   -t ghcr.io/ambit-mesh/ambit-proxy:0.1.0 .
#   docker build --target cni     -t ghcr.io/ambit-mesh/ambit-cni:0.1.0 .
#
# Built by scripts/images.sh with podman (no registry reachable there: BINARIES=prebuilt
# takes the binaries built on the machine and RUNTIME a base made from its files). With a
# registry, the defaults below build from source on the usual bases. The published images
# use distroless/cc-debian12 (glibc, CA certificates, a nonroot user; no shell, no package
# manager); the proxy adds `nft` and its libraries (the nftables redirection and the
# fallback when the kernel refuses the eBPF programs), nothing else.
# scripts/check-dockerfile.sh, run by scripts/test.sh, checks that every path copied
# exists, that the build stage copies what cargo needs (every workspace member, every
# path dependency and [patch] source, the files the manifest names), and that every
# binary copied is one the workspace builds.

# The Rust toolchain that builds from source.
ARG BUILDER=docker.io/library/rust:1.95-bookworm
# The runtime base of the three images.
ARG RUNTIME=gcr.io/distroless/cc-debian12
# Where the binaries come from: `build` (compiled here) or `prebuilt` (PREBUILT, a folder
# of the context holding bin/ and nft/, as scripts/images.sh lays it out).
ARG BINARIES=build
ARG PREBUILT=target/images/prebuilt

FROM ${BUILDER} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler cmake clang nftables \
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
RUN cargo build --release --locked -p ambit-control -p ambit-proxy -p ambit-cni
# The layout of the prebuilt stage: the binaries without debuginfo; nft and the libraries
# it links, at their paths under /usr.
RUN mkdir -p /out/bin /out/nft/usr/sbin \
 && for b in ambit-control ambit-proxy ambit-cni; do \
      objcopy --strip-debug target/release/$b /out/bin/$b; done \
 && cp /usr/sbin/nft /out/nft/usr/sbin/nft \
 && ldd /usr/sbin/nft | awk '/=> \// {print $3}' | while read -r lib; do \
      dest=/out/nft/usr${lib#/usr}; mkdir -p "$(dirname "$dest")"; cp "$(readlink -f "$lib")" "$dest"; done

FROM scratch AS prebuilt
ARG PREBUILT
COPY ${PREBUILT} /out

FROM ${BINARIES} AS binaries

FROM ${RUNTIME} AS control
COPY --from=binaries /out/bin/ambit-control /usr/local/bin/ambit-control
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ambit-control"]

FROM ${RUNTIME} AS proxy
COPY --from=binaries /out/nft/ /
COPY --from=binaries /out/bin/ambit-proxy /usr/local/bin/ambit-proxy
ENTRYPOINT ["/usr/local/bin/ambit-proxy"]

FROM ${RUNTIME} AS cni
# The installer copies this same binary into the host's CNI bin directory, where the
# runtime runs it as the chained plugin.
COPY --from=binaries /out/bin/ambit-cni /usr/local/bin/ambit-cni
ENTRYPOINT ["/usr/local/bin/ambit-cni"]
