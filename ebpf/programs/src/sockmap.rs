//! Sockmap on the in-pod hops: the application's socket and the proxy's socket at the other
//! end of the same loopback (or pod-address) connection are put in `INPOD_SOCKETS` by
//! `sockops` as each end becomes established, and the `sk_msg` program attached to that
//! SOCKHASH moves what one end sends into the other's receive queue (`BPF_F_INGRESS`).
//!
//! What it must get right (from the kernel's `tcp_bpf`; each has a test in
//! `ebpf/tests/sockmap.rs`):
//! - a socket is in the map before it can send its first byte (inserted at
//!   `*_ESTABLISHED`), so that the program sees every byte it sends;
//! - `bpf_msg_redirect_hash` answers `SK_DROP` when the peer is missing: the program
//!   answers `SK_PASS` whatever it says, or the bytes would be lost;
//! - a peer that arrives in the map after bytes went to it by TCP would read later,
//!   redirected bytes first (`tcp_bpf_recvmsg` serves its ingress queue before the TCP
//!   receive queue): a socket that sent by TCP once is marked in `PASSED` and keeps to TCP;
//! - a redirected hop has no backpressure (the sender's memory is handed to the peer's
//!   ingress queue, bounded only by the node's TCP memory: an iperf3 upload through a
//!   proxy got `ENOMEM` that way), and what the peer has read is not known here: each
//!   socket may move `SETTINGS[1]` bytes (its budget, counted in `REDIRECTED`), then goes
//!   back to TCP for good. That order is safe: the ingress queue, older, is read first.

use crate::{is_loopback, read, read6, v4_mapped, MESHED_NETNS};
use ambit_ebpf_common::{
    SockKey, FAMILY_V4, FAMILY_V6, OUTBOUND_PORT, PROXY_MARK, SETTING_SOCKMAP, SOCKMAP_BUDGET,
};
use aya_ebpf::{
    bindings::{sk_action, BPF_F_INGRESS},
    helpers::bpf_get_netns_cookie,
    macros::map,
    maps::{Array, LruHashMap, SockHash},
    programs::{SkMsgContext, SockOpsContext},
    EbpfContext,
};
use core::ptr::addr_of;

const AF_INET: u32 = 2;

/// `SETTING_*` bits (index 0) and the budget (index 1), written by the loader.
#[map(name = "AMBIT_SETTINGS")]
static SETTINGS: Array<u32> = Array::pinned(2, 0);

#[map(name = "AMBIT_INPOD_SOCKETS")]
static INPOD_SOCKETS: SockHash<SockKey> = SockHash::pinned(65536, 0);

#[map(name = "AMBIT_PASSED")]
static PASSED: LruHashMap<SockKey, u32> = LruHashMap::pinned(65536, 0);

#[map(name = "AMBIT_EXPECTED_PEERS")]
static EXPECTED_PEERS: LruHashMap<SockKey, u32> = LruHashMap::pinned(16384, 0);

/// Only the socket's own `sk_msg` runs update its count, one at a time (under the
/// socket's lock).
#[map(name = "AMBIT_REDIRECTED")]
static REDIRECTED: LruHashMap<SockKey, u64> = LruHashMap::pinned(65536, 0);

/// A key's addresses as the kernel hands them over, made family-neutral: a v4-mapped IPv6
/// address becomes the IPv4 one (its peer may be an IPv4 socket).
#[inline(always)]
fn addresses(family: u32, v4: (u32, u32), v6: ([u32; 4], [u32; 4])) -> ([u32; 4], [u32; 4], u32) {
    if family == AF_INET {
        return ([v4.0, 0, 0, 0], [v4.1, 0, 0, 0], u32::from(FAMILY_V4));
    }
    let (local, remote) = v6;
    if v4_mapped(&local) && v4_mapped(&remote) {
        return (
            [local[3], 0, 0, 0],
            [remote[3], 0, 0, 0],
            u32::from(FAMILY_V4),
        );
    }
    (local, remote, u32::from(FAMILY_V6))
}

/// `remote_port` of `bpf_sock_ops` and `sk_msg_md`: the port in network byte order, in
/// the upper half on a little-endian machine.
#[inline(always)]
fn remote_port(raw: u32) -> u32 {
    u32::from(u16::from_be((raw >> 16) as u16))
}

fn sockmap_on() -> bool {
    SETTINGS
        .get(0)
        .is_some_and(|flags| flags & SETTING_SOCKMAP != 0)
}

/// At `ACTIVE_ESTABLISHED` / `PASSIVE_ESTABLISHED`: puts the socket in `INPOD_SOCKETS` when
/// it is an end of an in-pod hop of a meshed pod:
/// - loopback to or from 4140: the application's redirected connection (active) and the
///   proxy's socket accepted on its outbound listener (passive);
/// - the pod's own address at both ends: the proxy delivering to the application (active,
///   the proxy's mark) and the application's accepted socket (passive) — that one only when
///   the proxy's end is expected, so that the application talking to itself is left alone.
pub fn pair(ctx: &SockOpsContext, passive: bool) {
    if !sockmap_on() {
        return;
    }
    // SAFETY: the helper only reads the context it is given.
    let netns_cookie = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: the value is only tested.
    if unsafe { MESHED_NETNS.get(&netns_cookie) }.is_none() {
        return;
    }
    let ops = ctx.ops;
    // SAFETY: `ops` is the program's context, valid for the whole run; each field is read
    // once at its constant offset.
    let (family, v4, v6, local_port, raw_remote_port) = unsafe {
        (
            read(addr_of!((*ops).family)),
            (
                read(addr_of!((*ops).local_ip4)),
                read(addr_of!((*ops).remote_ip4)),
            ),
            (
                read6(addr_of!((*ops).local_ip6)),
                read6(addr_of!((*ops).remote_ip6)),
            ),
            read(addr_of!((*ops).local_port)),
            read(addr_of!((*ops).remote_port)),
        )
    };
    let (local_ip, remote_ip, family) = addresses(family, v4, v6);
    let mut key = SockKey {
        netns_cookie,
        local_ip,
        remote_ip,
        local_port,
        remote_port: remote_port(raw_remote_port),
        family,
        pad: 0,
    };
    let loopback = is_loopback(&key.local_ip, key.family as u16)
        && is_loopback(&key.remote_ip, key.family as u16);
    let outbound_hop = loopback
        && (key.local_port == u32::from(OUTBOUND_PORT)
            || key.remote_port == u32::from(OUTBOUND_PORT));
    let delivery = !loopback && key.local_ip == key.remote_ip;
    if outbound_hop {
        insert(ctx, &mut key);
    } else if delivery && !passive && proxy_socket(ctx) {
        insert(ctx, &mut key);
        let _ = EXPECTED_PEERS.insert(&key.peer(), &1, 0);
    } else if delivery && passive {
        // SAFETY: the value is only tested.
        if unsafe { EXPECTED_PEERS.get(&key) }.is_some() {
            let _ = EXPECTED_PEERS.remove(&key);
            insert(ctx, &mut key);
        }
    }
}

/// Whether the socket carries the proxy's mark (read from `ctx->sk`). A pod's process can
/// set that mark too (`CAP_NET_RAW`); all it gains is sockmap between two of its own
/// sockets, which is as correct as TCP.
fn proxy_socket(ctx: &SockOpsContext) -> bool {
    // SAFETY: `sk` is a pointer field of the context, read once.
    let sk = unsafe { (*ctx.ops).__bindgen_anon_2.sk };
    if sk.is_null() {
        return false;
    }
    // SAFETY: checked for null; `mark` is a readable field of `bpf_sock`.
    unsafe { (*sk).mark == PROXY_MARK }
}

fn insert(ctx: &SockOpsContext, key: &mut SockKey) {
    // A connection earlier at the same addresses and ports may have left its mark.
    let _ = PASSED.remove(key);
    // SAFETY: the context pointer is valid for the whole program run.
    let ops = unsafe { &mut *ctx.ops };
    // A full map leaves the socket out: its bytes, and its peer's, take TCP. A socket
    // whose count cannot be kept never redirects (see `forward`).
    if INPOD_SOCKETS.update(key, ops, 0).is_ok() {
        let _ = REDIRECTED.insert(key, &0, 0);
    }
}

fn budget() -> u64 {
    match SETTINGS.get(1) {
        Some(&n) if n != 0 => u64::from(n),
        _ => u64::from(SOCKMAP_BUDGET),
    }
}

/// The `sk_msg` verdict for bytes a socket of `INPOD_SOCKETS` sends.
pub fn forward(ctx: &SkMsgContext) -> u32 {
    let msg = ctx.msg;
    // SAFETY: `msg` is the program's context, valid for the whole run; each field is read
    // once at its constant offset.
    let (family, v4, v6, local_port, raw_remote_port) = unsafe {
        (
            read(addr_of!((*msg).family)),
            (
                read(addr_of!((*msg).local_ip4)),
                read(addr_of!((*msg).remote_ip4)),
            ),
            (
                read6(addr_of!((*msg).local_ip6)),
                read6(addr_of!((*msg).remote_ip6)),
            ),
            read(addr_of!((*msg).local_port)),
            read(addr_of!((*msg).remote_port)),
        )
    };
    let (local_ip, remote_ip, family) = addresses(family, v4, v6);
    let key = SockKey {
        // SAFETY: the helper only reads the context it is given.
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        local_ip,
        remote_ip,
        local_port,
        remote_port: remote_port(raw_remote_port),
        family,
        pad: 0,
    };
    // SAFETY: the value is only tested.
    if unsafe { PASSED.get(&key) }.is_some() {
        return sk_action::SK_PASS;
    }
    let mut peer = key.peer();
    // SAFETY: `msg` is the program's context; read once.
    let size = u64::from(unsafe { read(addr_of!((*msg).size)) });
    let count = REDIRECTED.get_ptr_mut(&key);
    // SAFETY: a map value, valid while the program runs, written only by this socket's
    // runs (one at a time).
    let spent = count.map(|c| unsafe { *c });
    // No count (lost), the budget spent, or no peer (not paired, or gone): these bytes go
    // by TCP, and so will every later byte of this socket — its reader gets the
    // redirected ones first.
    if spent.is_none_or(|n| n + size > budget())
        || INPOD_SOCKETS.redirect_msg(ctx, &mut peer, u64::from(BPF_F_INGRESS))
            != i64::from(sk_action::SK_PASS)
    {
        let _ = PASSED.insert(&key, &1, 0);
        // Never SK_DROP: that would lose the bytes.
        return sk_action::SK_PASS;
    }
    if let (Some(c), Some(n)) = (count, spent) {
        // SAFETY: as above.
        unsafe { *c = n + size };
    }
    sk_action::SK_PASS
}
