#!/usr/bin/env bash
# Builds the chart's three images (ambit-control, ambit-proxy, ambit-cni) with podman from
# the Dockerfile, tags them as the chart's defaults (values.yaml image.registry, the
# chart's appVersion), prints each one's size and files, and saves each as an OCI archive
# that kind, k3d or containerd load (`kind load image-archive F`,
# `ctr -n k8s.io images import F`).
#
#   ./scripts/images.sh [--profile release|debug] [--out DIR] [--tag TAG]   (root)
#
# No registry is reachable on these machines, so nothing is pulled: the binaries are built
# here (cargo, --profile), stripped of debuginfo, and copied in by the Dockerfile's
# `prebuilt` stage (BINARIES=prebuilt), with `nft` and the libraries it links from this
# machine (Debian 12, as the published images); the runtime base is made here too, from
# this machine's files: what distroless/cc-debian12 holds that the binaries use (glibc,
# libgcc_s, CA certificates, /etc/passwd with root and nonroot 65532, its PATH), and no shell or
# package manager. With a registry, `podman build`/`docker build --target control .`
# builds from source on the Dockerfile's default bases instead.
#
# Writes DIR/images.json ({"control": "REF", "proxy": ..., "cni": ..., "engine": [the
# flags `podman run` needs on this machine]}) for the tests (tests/tests/images.rs).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=release out=target/images tag=""
while [ $# -gt 0 ]; do
    case "$1" in
        --profile) profile=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        *) echo "usage: $0 [--profile release|debug] [--out DIR] [--tag TAG]" >&2; exit 2 ;;
    esac
done
case "$profile" in release|debug) ;; *) echo "images.sh: --profile is release or debug" >&2; exit 2 ;; esac
[ "$(id -u)" = 0 ] || { echo "images.sh: needs root (podman's storage is root's)" >&2; exit 1; }

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v nft >/dev/null || missing+=(nftables)
command -v objcopy >/dev/null || missing+=(binutils)
[ -f /etc/ssl/certs/ca-certificates.crt ] || missing+=(ca-certificates)
if [ ${#missing[@]} -gt 0 ]; then
    echo "images.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

registry="$(sed -n 's/^  registry: *//p' helm/ambit/values.yaml | head -1)"
[ -n "$tag" ] || tag="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' helm/ambit/Chart.yaml)"
[ -n "$registry" ] && [ -n "$tag" ] || { echo "images.sh: no image.registry in values.yaml or appVersion in Chart.yaml" >&2; exit 1; }

# What podman needs on these machines: runc (crun refuses their hybrid cgroup layout), and
# rlimits no higher than this shell's hard ones (podman asks for more as root), processes
# no more than pid_max (runc refuses more).
nproc=$(ulimit -Hu)
[ "$nproc" != unlimited ] && [ "$nproc" -le "$(cat /proc/sys/kernel/pid_max)" ] || nproc=$(cat /proc/sys/kernel/pid_max)
engine=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
if [ -d /sys/fs/cgroup/unified ] || ! command -v crun >/dev/null; then
    engine+=(--runtime runc)
fi

echo "==> binaries ($profile)"
flags=(--locked -q -p ambit-control -p ambit-proxy -p ambit-cni)
[ "$profile" = release ] && flags+=(--release)
cargo build "${flags[@]}"

# --- The prebuilt stage's context: the binaries, stripped, and nft with its libraries. Always
# here, whatever --out is: the one folder under target/ that .dockerignore lets in.
pre="target/images/prebuilt"
rm -rf "$pre"
mkdir -p "$pre/bin" "$pre/nft/usr/sbin"
for b in ambit-control ambit-proxy ambit-cni; do
    objcopy --strip-debug "target/$profile/$b" "$pre/bin/$b"
done
# Every library a binary links, at its path under /usr (Debian 12 merged /lib into /usr).
closure() { # binary destination
    ldd "$1" | awk '/=> \// {print $3} /^\t\/lib64/ {print $1}' | while read -r lib; do
        real="$(readlink -f "$lib")"
        dest="$2/usr${lib#/usr}"
        mkdir -p "$(dirname "$dest")"
        cp "$real" "$dest"
    done
}
cp "$(command -v nft)" "$pre/nft/usr/sbin/nft"
closure "$(command -v nft)" "$pre/nft"

# --- The runtime base: distroless/cc's share of this machine.
base="localhost/ambit/runtime:bookworm"
root="$(mktemp -d)"
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{etc/ssl/certs,tmp,home/nonroot,usr/lib/x86_64-linux-gnu,usr/lib64,var/run}
chmod 1777 "$root/tmp"
ln -s usr/lib "$root/lib"
ln -s usr/lib64 "$root/lib64"
for b in "$pre"/bin/*; do closure "$b" "$root"; done
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$root/etc/group"
printf 'hosts: files dns\n' > "$root/etc/nsswitch.conf"
chown 65532:65532 "$root/home/nonroot"
tar -C "$root" --numeric-owner -c . \
    | podman import -q --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$base" >/dev/null

echo "==> images ($registry, $tag)"
mkdir -p "$out"
json="{"
for target in control proxy cni; do
    ref="$registry/ambit-$target:$tag"
    podman build -q "${engine[@]}" --network none --target "$target" \
        --build-arg BINARIES=prebuilt --build-arg PREBUILT="$pre" --build-arg RUNTIME="$base" \
        -t "$ref" . >/dev/null
    size="$(podman image inspect --format '{{.Size}}' "$ref")"
    printf '%s: %s MB uncompressed\n' "$ref" "$(( size / 1000000 ))"
    c="$(podman create "${engine[@]}" "$ref")"
    podman export "$c" | tar -tv | awk '$1 !~ /^d/ {printf "  %10d %s\n", $3, $6}' | sort -k2
    podman rm -f "$c" >/dev/null
    rm -f "$out/ambit-$target.oci.tar"
    podman save -q --format oci-archive -o "$out/ambit-$target.oci.tar" "$ref"
    json+="\"$target\": \"$ref\", "
done
# What `podman run` needs here beside the container's own flags.
json+="\"engine\": [$(printf '"%s", ' "${engine[@]}" | sed 's/, $//')]"
echo "$json}" > "$out/images.json"
echo "==> saved: $(ls "$out"/*.oci.tar | tr '\n' ' ')"
