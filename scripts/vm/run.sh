#!/usr/bin/env bash
# Runs a command as root inside a KVM guest booting Debian 12's own kernel, which has
# kernel TLS (CONFIG_TLS=m) where the kernel of these machines has none
# (docs/ARCHITECTURE.md, "How a connection flows", 4a). The guest sees the host's root
# read-only with a tmpfs overlay (it may write anywhere; nothing reaches the host), and
# the current directory read-write at the same path; the command runs there, with the
# AMBIT_*, CARGO_* and RUST* variables of the caller. Its output is the guest's console;
# the script exits with the command's status.
#
#   scripts/vm/run.sh [--] COMMAND [ARG...]
#
# AMBIT_VM_MEM (4G), AMBIT_VM_CPUS (2) size the guest; AMBIT_VM_TIMEOUT (seconds, 0: none)
# bounds it; AMBIT_VM_ACCEL (auto) is kvm or tcg. Needs root. What it installs or builds is
# cached in /var/cache/ambit-vm (the kernel, its modules, the initramfs); a run of `true`
# takes ~10 s.
#
# KVM: these machines are themselves guests of a PVM hypervisor (the kvm module is
# kvm_pvm, no VMX/SVM): their /dev/kvm opens, but only boots kernels built as PVM guests
# (Debian's hangs at once). So the guest is emulated (TCG, multi-threaded) unless the host
# has a hardware KVM (kvm_intel, kvm_amd): correct, but ~10x slower than the host, and
# 40-150 ms a fork+exec.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: $0 [--] COMMAND [ARG...]" >&2; exit 2; }

cache=/var/cache/ambit-vm
mem="${AMBIT_VM_MEM:-4G}"
cpus="${AMBIT_VM_CPUS:-2}"
timeout_s="${AMBIT_VM_TIMEOUT:-0}"
accel="${AMBIT_VM_ACCEL:-auto}"
if [ "$accel" = auto ]; then
    accel=tcg
    if [ -w /dev/kvm ] && { [ -d /sys/module/kvm_intel ] || [ -d /sys/module/kvm_amd ]; }; then
        accel=kvm
    fi
fi
case "$accel" in
    kvm) cpu=(-accel kvm -cpu host) ;;
    tcg) cpu=(-accel tcg,thread=multi,tb-size=512 -cpu max,la57=off) ;;
    *) echo "scripts/vm: AMBIT_VM_ACCEL is kvm or tcg, not $accel" >&2; exit 2 ;;
esac

# --- What the guest needs on the host: qemu, a static busybox for the initramfs, kmod
# (depmod here, modprobe in the guest).
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
{ [ -x /bin/busybox ] && /bin/busybox --list | grep -x cpio >/dev/null; } || missing+=(busybox-static)
command -v depmod >/dev/null || missing+=(kmod)
if [ ${#missing[@]} -gt 0 ]; then
    echo "scripts/vm: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null
fi

# --- Debian's kernel, extracted (never installed on the host).
mkdir -p "$cache"
if [ ! -f "$cache/kernel.ready" ]; then
    pkg="$(apt-cache depends linux-image-amd64 | sed -n 's/.*Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -1)"
    [ -n "$pkg" ] || { echo "scripts/vm: no linux-image package for linux-image-amd64" >&2; exit 1; }
    echo "scripts/vm: fetching $pkg" >&2
    rm -rf "$cache/root" "$cache"/*.deb
    (cd "$cache" && apt-get download "$pkg" 2>/dev/null)
    dpkg-deb -x "$cache"/"$pkg"_*.deb "$cache/root"
    rm -f "$cache"/*.deb
    kver="${pkg#linux-image-}"
    depmod -b "$cache/root" "$kver"
    echo "$kver" > "$cache/kernel.ready"
    rm -f "$cache/initramfs.gz"
fi
kver="$(cat "$cache/kernel.ready")"
modules="$cache/root/lib/modules/$kver"

# --- The initramfs: busybox, /init, and the modules that reach the host's files.
if [ ! -f "$cache/initramfs.gz" ] || [ "$here/init" -nt "$cache/initramfs.gz" ]; then
    tmp="$(mktemp -d)"
    mkdir -p "$tmp"/{bin,proc,sys,dev,modules}
    cp /bin/busybox "$tmp/bin/busybox"
    cp "$here/init" "$tmp/init"
    for m in virtio_pci 9pnet_virtio 9p overlay; do
        modprobe -d "$cache/root" -S "$kver" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
    done | awk '!seen[$0]++' | while read -r ko; do
        cp "$ko" "$tmp/modules/"
        basename "$ko" >> "$tmp/modules.list"
    done
    (cd "$tmp" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1) > "$cache/initramfs.gz.new"
    mv "$cache/initramfs.gz.new" "$cache/initramfs.gz"
    rm -rf "$tmp"
fi

# --- The command and its environment, through an exchange directory.
xfer="$(mktemp -d /tmp/ambit-vm.XXXXXX)"
trap 'rm -rf "$xfer"' EXIT
printf '%q ' "$@" > "$xfer/cmd"
{
    # Without pyenv's shims: each costs ~20 s in an emulated guest; Debian's python3 serves.
    path="$(printf '%s' "$PATH" | tr ':' '\n' | grep -v pyenv | paste -sd:)"
    printf 'export PATH=%q HOME=%q LANG=C.UTF-8 AMBIT_VM_CWD=%q\n' "$path" "$HOME" "$PWD"
    env | grep -E '^(AMBIT_|CARGO_|RUST)[A-Za-z0-9_]*=' | while IFS='=' read -r k v; do
        printf 'export %s=%q\n' "$k" "$v"
    done
} > "$xfer/env"

qemu=(qemu-system-x86_64 "${cpu[@]}" -smp "$cpus" -m "$mem"
    -nographic -no-reboot -nic none -serial mon:stdio -display none
    -nodefaults -bios /usr/share/qemu/qboot.rom
    -kernel "$cache/root/boot/vmlinuz-$kver" -initrd "$cache/initramfs.gz"
    -append "console=ttyS0 quiet loglevel=5 softlockup_panic=1 panic=-1 mitigations=off tsc=reliable ambit_work=$PWD ambit_modules=$modules"
    -virtfs local,path=/,mount_tag=hostroot,security_model=passthrough,readonly=on,multidevs=remap
    -virtfs "local,path=$PWD,mount_tag=work,security_model=passthrough,multidevs=remap"
    -virtfs "local,path=$xfer,mount_tag=xfer,security_model=passthrough")
[ "$timeout_s" = 0 ] || qemu=(timeout "$timeout_s" "${qemu[@]}")
qrc=0
"${qemu[@]}" </dev/null || qrc=$?
[ "$qrc" != 124 ] || echo "scripts/vm: timed out after ${timeout_s} s (AMBIT_VM_TIMEOUT)" >&2
[ -f "$xfer/rc" ] || { echo "scripts/vm: the guest ended without the command's status (qemu: $qrc)" >&2; exit 125; }
exit "$(cat "$xfer/rc")"
