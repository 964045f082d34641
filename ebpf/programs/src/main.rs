//! Ambit's redirection programs.
//!
//! - `ambit_connect4` / `ambit_connect6` (`cgroup/connect4`, `cgroup/connect6`): a TCP
//!   `connect()` from a meshed pod's netns goes to the pod's in-pod outbound listener
//!   (loopback:4140) instead; the original destination is remembered by socket cookie.
//!   The proxy's own sockets (its mark, from the proxy's cgroup), loopback destinations and skip-outbound ports are
//!   left alone.
//! - `ambit_sockops` (`sockops`, at `TCP_CONNECT_CB`, once the client port is chosen):
//!   re-keys that destination by (netns cookie, client port), which is what the proxy can
//!   compute from the connection it accepts. With sockmap on, at `ACTIVE_ESTABLISHED` and
//!   `PASSIVE_ESTABLISHED` — before either end can send a byte — it also puts both ends of
//!   each in-pod hop (application ↔ proxy) in `INPOD_SOCKETS`.
//! - `ambit_sk_msg` (`sk_msg`, on `INPOD_SOCKETS`): bytes an end of an in-pod hop sends go
//!   straight into its peer's receive queue, past the loopback TCP stack; when the peer is
//!   not in the map the bytes take TCP (`SK_PASS`, never `SK_DROP`), and that socket keeps
//!   to TCP from then on, so that no later byte overtakes them; so does a socket that has
//!   moved its budget (a redirected hop has no backpressure: the budget bounds what a
//!   reader can have queued).
//! - `ambit_sk_lookup` (`sk_lookup`, one link per meshed pod netns): TCP for the pod's own
//!   addresses goes to the proxy's in-pod listener — 4143 for the mesh port, 4144 for
//!   everything else — except skip-inbound ports and connections from the pod to itself;
//!   any other address of the pod's netns but loopback (one the proxy was not told of) is
//!   refused.
//!   When the listener is missing (the proxy is down) the connection is dropped, never
//!   delivered to the application in the clear: fail closed.

#![no_std]
#![no_main]

mod sockmap;

use ambit_ebpf_common::{
    ConnKey, InboundPod, ListenerKey, OrigDst, OutboundPod, PodIp, FAMILY_V4, FAMILY_V6,
    LISTENER_MESH, LISTENER_PLAIN, MESH_PORT, OUTBOUND_PORT, PROXY_MARK,
};
use aya_ebpf::{
    bindings::{
        bpf_sock_addr, sk_action, BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_TCP_CONNECT_CB,
    },
    helpers::{bpf_get_current_cgroup_id, bpf_get_netns_cookie, bpf_get_socket_cookie},
    macros::{cgroup_sock_addr, map, sk_lookup, sk_msg, sock_ops},
    maps::{Array, HashMap, LruHashMap, SockHash},
    programs::{SkLookupContext, SkMsgContext, SockAddrContext, SockOpsContext},
    EbpfContext,
};
use core::ptr::{addr_of, addr_of_mut};

const IPPROTO_TCP: u32 = 6;
const AF_INET: u32 = 2;
/// `connect` hooks: 1 lets the (possibly rewritten) `connect()` proceed.
const ALLOW: i32 = 1;

#[map(name = "AMBIT_MESHED_NETNS")]
pub(crate) static MESHED_NETNS: HashMap<u64, OutboundPod> = HashMap::pinned(4096, 0);

#[map(name = "AMBIT_SOCKET_DST")]
static SOCKET_DST: LruHashMap<u64, OrigDst> = LruHashMap::pinned(65536, 0);

#[map(name = "AMBIT_ORIG_DST")]
static ORIG_DST: LruHashMap<ConnKey, OrigDst> = LruHashMap::pinned(65536, 0);

/// The node proxy's cgroup v2 id (index 0), written by the loader.
#[map(name = "AMBIT_PROXY_CGROUP")]
static PROXY_CGROUP: Array<u64> = Array::pinned(1, 0);

#[map(name = "AMBIT_POD_IPS")]
static POD_IPS: HashMap<PodIp, InboundPod> = HashMap::pinned(8192, 0);

// `redirect_sk_lookup` takes `&mut self` in aya-ebpf 0.1.
#[map(name = "AMBIT_LISTENERS")]
static mut LISTENERS: SockHash<ListenerKey> = SockHash::pinned(16384, 0);

/// Reads one context field. Volatile, so that the compiler keeps one load per field at
/// a constant offset: the verifier refuses context loads through a computed pointer
/// (which it makes when two branches read different fields of the same shape).
#[inline(always)]
pub(crate) fn read(field: *const u32) -> u32 {
    // SAFETY: `field` points into the program's context, valid for the whole run.
    unsafe { core::ptr::read_volatile(field) }
}

/// Reads an IPv6 address from the context, word by word (see [`read`]).
#[inline(always)]
pub(crate) fn read6(field: *const [u32; 4]) -> [u32; 4] {
    let w = field.cast::<u32>();
    // SAFETY: the four words are inside the same context field.
    unsafe { [read(w), read(w.add(1)), read(w.add(2)), read(w.add(3))] }
}

/// The meshed pod whose netns this socket is in, unless the socket is the proxy's own.
fn meshed_pod(ctx: &SockAddrContext, sa: &bpf_sock_addr) -> Option<OutboundPod> {
    if sa.protocol != IPPROTO_TCP {
        return None;
    }
    // SAFETY: the helper only reads the context it is given.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    let pod = unsafe { MESHED_NETNS.get(&netns) }.copied()?;
    // SAFETY: `sk` of a sock_addr context is the socket doing the connect.
    let sk = unsafe { sa.__bindgen_anon_1.sk };
    if sk.is_null() {
        return None;
    }
    // SAFETY: checked for null; `mark` is a readable field of `bpf_sock`.
    if unsafe { (*sk).mark } == PROXY_MARK && in_proxy_cgroup() {
        return None;
    }
    Some(pod)
}

/// Whether the task connecting is the node proxy (its cgroup): a pod's process that sets
/// the proxy's mark on its socket (`SO_MARK` takes only `CAP_NET_RAW`) is redirected all
/// the same.
#[inline(always)]
fn in_proxy_cgroup() -> bool {
    // SAFETY: the helper reads the current task's cgroup; no arguments.
    let current = unsafe { bpf_get_current_cgroup_id() };
    PROXY_CGROUP
        .get(0)
        .is_some_and(|proxy| *proxy != 0 && *proxy == current)
}

/// Remembers `dst` for this socket; the connect is redirected even if that fails (the
/// proxy then refuses the connection: fail closed, never around the proxy).
fn remember(ctx: &SockAddrContext, dst: &OrigDst) {
    // SAFETY: the helper only reads the context it is given.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    let _ = SOCKET_DST.insert(&cookie, dst, 0);
}

#[cgroup_sock_addr(connect4)]
pub fn ambit_connect4(ctx: SockAddrContext) -> i32 {
    // SAFETY: the context pointer is valid for the whole program run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(pod) = meshed_pod(&ctx, sa) else {
        return ALLOW;
    };
    let ip = read(addr_of!(sa.user_ip4));
    let port = u16::from_be(sa.user_port as u16);
    if ip.to_ne_bytes()[0] == 127 || pod.skip.contains(port) {
        return ALLOW;
    }
    remember(
        &ctx,
        &OrigDst {
            ip: [ip, 0, 0, 0],
            port,
            family: FAMILY_V4,
        },
    );
    sa.user_ip4 = u32::from_ne_bytes([127, 0, 0, 1]);
    sa.user_port = u32::from(OUTBOUND_PORT.to_be());
    ALLOW
}

pub(crate) fn v4_mapped(ip: &[u32; 4]) -> bool {
    ip[0] == 0 && ip[1] == 0 && ip[2] == 0xffff_u32.to_be()
}

#[cgroup_sock_addr(connect6)]
pub fn ambit_connect6(ctx: SockAddrContext) -> i32 {
    // SAFETY: the context pointer is valid for the whole program run.
    let sa = unsafe { &mut *ctx.sock_addr };
    let Some(pod) = meshed_pod(&ctx, sa) else {
        return ALLOW;
    };
    let ip = read6(addr_of!(sa.user_ip6));
    let port = u16::from_be(sa.user_port as u16);
    let mapped = v4_mapped(&ip);
    let loopback = if mapped {
        ip[3].to_ne_bytes()[0] == 127
    } else {
        ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] == 1_u32.to_be()
    };
    if loopback || pod.skip.contains(port) {
        return ALLOW;
    }
    let dst = if mapped {
        OrigDst {
            ip: [ip[3], 0, 0, 0],
            port,
            family: FAMILY_V4,
        }
    } else {
        OrigDst {
            ip,
            port,
            family: FAMILY_V6,
        }
    };
    remember(&ctx, &dst);
    // A v4-mapped destination is an IPv4 connection on the wire: send it to the IPv4
    // listener; a real IPv6 one to the IPv6 listener (absent for a v4-only pod, so the
    // connect fails rather than leave the pod unproxied).
    sa.user_ip6 = if mapped {
        [0, 0, 0xffff_u32.to_be(), u32::from_ne_bytes([127, 0, 0, 1])]
    } else {
        [0, 0, 0, 1_u32.to_be()]
    };
    sa.user_port = u32::from(OUTBOUND_PORT.to_be());
    ALLOW
}

#[sock_ops]
pub fn ambit_sockops(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_TCP_CONNECT_CB => rekey(&ctx),
        BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB => sockmap::pair(&ctx, false),
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => sockmap::pair(&ctx, true),
        _ => {}
    }
    1
}

#[sk_msg]
pub fn ambit_sk_msg(ctx: SkMsgContext) -> u32 {
    sockmap::forward(&ctx)
}

/// Moves a redirected socket's destination from its socket cookie to (netns cookie,
/// client port): the client port is chosen by now, and the SYN not yet sent, so the entry
/// is there before the proxy can accept the connection.
fn rekey(ctx: &SockOpsContext) {
    // SAFETY: the helper only reads the context it is given.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    // SAFETY: the value is copied out at once.
    let Some(dst) = (unsafe { SOCKET_DST.get(&cookie) }).copied() else {
        return;
    };
    let family = if ctx.family() == AF_INET || v4_mapped(&ctx.local_ip6()) {
        FAMILY_V4
    } else {
        FAMILY_V6
    };
    let key = ConnKey {
        // SAFETY: the helper only reads the context it is given.
        netns_cookie: unsafe { bpf_get_netns_cookie(ctx.as_ptr()) },
        port: ctx.local_port() as u16,
        family,
        pad: 0,
    };
    let _ = ORIG_DST.insert(&key, &dst, 0);
    let _ = SOCKET_DST.remove(&cookie);
}

#[sk_lookup]
pub fn ambit_sk_lookup(ctx: SkLookupContext) -> u32 {
    steer(&ctx)
}

fn steer(ctx: &SkLookupContext) -> u32 {
    // SAFETY: the context pointer is valid for the whole program run.
    let l = unsafe { &*ctx.lookup };
    if l.protocol != IPPROTO_TCP {
        return sk_action::SK_PASS;
    }
    let (ip, remote, family) = if l.family == AF_INET {
        (
            [read(addr_of!(l.local_ip4)), 0, 0, 0],
            [read(addr_of!(l.remote_ip4)), 0, 0, 0],
            FAMILY_V4,
        )
    } else {
        (
            read6(addr_of!(l.local_ip6)),
            read6(addr_of!(l.remote_ip6)),
            FAMILY_V6,
        )
    };
    // The pod talking to itself — and the proxy delivering to the application, which it
    // does from the pod's own address — takes the ordinary path; so does loopback.
    if ip == remote || is_loopback(&ip, family) {
        return sk_action::SK_PASS;
    }
    let key = PodIp {
        ip,
        family: u32::from(family),
    };
    // SAFETY: the value is copied out at once.
    let Some(pod) = (unsafe { POD_IPS.get(&key) }).copied() else {
        // This program runs only in meshed pods' namespaces: an address of the pod the
        // proxy was not told of (an IPv6 or link-local address of a pod redirected for
        // IPv4, an address not known yet) is refused, never delivered around the proxy.
        return sk_action::SK_DROP;
    };
    let port = read(addr_of!(l.local_port)) as u16;
    if pod.skip.contains(port) {
        return sk_action::SK_PASS;
    }
    let kind = if port == MESH_PORT {
        LISTENER_MESH
    } else {
        LISTENER_PLAIN
    };
    let listener = ListenerKey {
        ip,
        family: u32::from(family),
        kind,
    };
    // SAFETY: programs run one at a time per CPU and the map is only read here.
    let listeners = unsafe { &mut *addr_of_mut!(LISTENERS) };
    match listeners.redirect_sk_lookup(ctx, listener, 0) {
        Ok(()) => sk_action::SK_PASS,
        // A meshed pod whose listener is gone: refuse rather than bypass the proxy.
        Err(_) => sk_action::SK_DROP,
    }
}

/// 127.0.0.0/8, `::1`, and `::ffff:127.0.0.0/104` (words in network order).
#[inline(always)]
pub(crate) fn is_loopback(ip: &[u32; 4], family: u16) -> bool {
    if family == FAMILY_V4 {
        return ip[0].to_ne_bytes()[0] == 127;
    }
    let mapped = ip[0] == 0 && ip[1] == 0 && ip[2] == 0xffff_u32.to_be();
    (ip[0] == 0 && ip[1] == 0 && ip[2] == 0 && ip[3] == 1_u32.to_be())
        || (mapped && ip[3].to_ne_bytes()[0] == 127)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

/// GPL-compatible, as the socket-cookie and `sk_assign` helpers require.
#[no_mangle]
#[link_section = "license"]
pub static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
