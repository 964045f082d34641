//! Types shared by Ambit's eBPF redirection programs (`ebpf/programs`) and their loader
//! (`ambit-ebpf`). Every type is `#[repr(C)]`, `Copy`, with explicit padding, so that both
//! sides agree on its bytes; the `user` feature adds `aya::Pod` for the loader.
//!
//! Addresses are kept as the kernel hands them to the programs: IPv4 in the low word of
//! `ip` (network byte order, as `u32::from_ne_bytes(octets)`), IPv6 as four words in
//! network byte order; an IPv4 address has the other three words zero.

#![no_std]

/// Outbound capture port (the in-pod listener the `connect` hooks send to).
pub const OUTBOUND_PORT: u16 = 4140;
/// Inbound mTLS (mesh tunnel) port.
pub const MESH_PORT: u16 = 4143;
/// Inbound plaintext capture port.
pub const INBOUND_PLAIN_PORT: u16 = 4144;
/// `SO_MARK` the proxy puts on its own sockets, which the `connect` hooks leave alone.
pub const PROXY_MARK: u32 = 0x0a3b_0000;
/// How many skip-port ranges one pod may have per direction.
pub const MAX_PORT_RANGES: usize = 16;

/// `AF_INET`.
pub const FAMILY_V4: u16 = 2;
/// `AF_INET6`.
pub const FAMILY_V6: u16 = 10;

/// The listener kinds a pod's inbound traffic is steered to.
pub const LISTENER_MESH: u32 = 0;
/// The plaintext inbound listener.
pub const LISTENER_PLAIN: u32 = 1;

/// Bit of `SETTINGS[0]`: `sockops` pairs the in-pod hops' sockets in `INPOD_SOCKETS`, and
/// the `sk_msg` program moves their bytes from one to the other.
pub const SETTING_SOCKMAP: u32 = 1;

/// Bytes a socket may move by `sk_msg` over its life (the default of `SETTINGS[1]`): past
/// it, it goes back to TCP for good, and TCP's windows hold it back. A redirected hop has
/// no backpressure, and the kernel does not say what the peer has read (that takes a
/// tracing program, which nodes may refuse), so this is what bounds the bytes a reader can
/// have queued and unread — to about what TCP itself lets a writer queue.
pub const SOCKMAP_BUDGET: u32 = 4 << 20;

/// Map names, as the programs declare them and the loader finds them (and pins them under
/// the pin directory with these names).
pub mod maps {
    /// Netns cookie → [`super::OutboundPod`]: the meshed pods' network namespaces.
    pub const MESHED_NETNS: &str = "AMBIT_MESHED_NETNS";
    /// Socket cookie → [`super::OrigDst`], from `connect` until the connection is made.
    pub const SOCKET_DST: &str = "AMBIT_SOCKET_DST";
    /// [`super::ConnKey`] → [`super::OrigDst`]: what the proxy reads after `accept`.
    pub const ORIG_DST: &str = "AMBIT_ORIG_DST";
    /// [`super::PodIp`] → [`super::InboundPod`]: the meshed pods' addresses.
    pub const POD_IPS: &str = "AMBIT_POD_IPS";
    /// [`super::ListenerKey`] → the proxy's in-pod listening socket (a SOCKHASH).
    pub const LISTENERS: &str = "AMBIT_LISTENERS";
    /// Index 0 → the node proxy's cgroup v2 id: only its sockets may skip redirection by
    /// the proxy's mark (any process with `CAP_NET_RAW` can set a mark).
    pub const PROXY_CGROUP: &str = "AMBIT_PROXY_CGROUP";
    /// Index 0 → the `SETTING_*` bits the loader sets (the switch for sockmap); index 1 →
    /// the bytes a socket may move by `sk_msg` ([`super::SOCKMAP_BUDGET`]).
    pub const SETTINGS: &str = "AMBIT_SETTINGS";
    /// [`super::SockKey`] → a socket of an in-pod hop (a SOCKHASH the `sk_msg` program is
    /// attached to): the application's and the proxy's ends of the same connection.
    pub const INPOD_SOCKETS: &str = "AMBIT_INPOD_SOCKETS";
    /// [`super::SockKey`] → 1: a socket whose first bytes went by TCP because its peer was
    /// not in `INPOD_SOCKETS`; it keeps to TCP, or its later bytes would overtake them.
    pub const PASSED: &str = "AMBIT_PASSED";
    /// [`super::SockKey`] → 1: the application's end of a connection the proxy opened to
    /// it (delivery from the pod's own address), expected by `sockops`.
    pub const EXPECTED_PEERS: &str = "AMBIT_EXPECTED_PEERS";
    /// [`super::SockKey`] → bytes that paired socket has moved by `sk_msg` so far.
    pub const REDIRECTED: &str = "AMBIT_REDIRECTED";
}

/// Program names, as the programs' functions are called.
pub mod programs {
    /// `cgroup/connect4`.
    pub const CONNECT4: &str = "ambit_connect4";
    /// `cgroup/connect6`.
    pub const CONNECT6: &str = "ambit_connect6";
    /// `sockops`, which re-keys the original destination by client port.
    pub const SOCKOPS: &str = "ambit_sockops";
    /// `sk_lookup`, attached to each meshed pod's netns.
    pub const SK_LOOKUP: &str = "ambit_sk_lookup";
    /// `sk_msg`, attached to the `INPOD_SOCKETS` SOCKHASH.
    pub const SK_MSG: &str = "ambit_sk_msg";
}

/// An inclusive range of ports, host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortRange {
    /// First port.
    pub first: u16,
    /// Last port (inclusive).
    pub last: u16,
}

/// Up to [`MAX_PORT_RANGES`] port ranges.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PortRanges {
    /// The ranges; only the first `len` count.
    pub ranges: [PortRange; MAX_PORT_RANGES],
    /// How many ranges are set.
    pub len: u32,
}

impl PortRanges {
    /// Whether `port` falls in one of the ranges (a bounded loop the verifier accepts).
    #[inline(always)]
    pub fn contains(&self, port: u16) -> bool {
        let mut i = 0;
        while i < MAX_PORT_RANGES {
            if (i as u32) >= self.len {
                return false;
            }
            let r = self.ranges[i];
            if port >= r.first && port <= r.last {
                return true;
            }
            i += 1;
        }
        false
    }
}

/// What the `connect` hooks know of a meshed pod (value of `MESHED_NETNS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboundPod {
    /// `config.ambit.dev/skip-outbound-ports`.
    pub skip: PortRanges,
}

/// What `sk_lookup` knows of a meshed pod address (value of `POD_IPS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboundPod {
    /// `config.ambit.dev/skip-inbound-ports`.
    pub skip: PortRanges,
}

/// An address family and address (key of `POD_IPS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodIp {
    /// The address words (see the crate doc).
    pub ip: [u32; 4],
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u32,
}

/// A pod address and listener kind (key of the `LISTENERS` SOCKHASH).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ListenerKey {
    /// The pod address.
    pub ip: [u32; 4],
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u32,
    /// [`LISTENER_MESH`] or [`LISTENER_PLAIN`].
    pub kind: u32,
}

/// A redirected connection as the proxy sees it after `accept` (key of `ORIG_DST`): the
/// pod's netns and the client's port, which together are unique while it is open.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// `SO_NETNS_COOKIE` of the pod's network namespace.
    pub netns_cookie: u64,
    /// The client's (source) port, host byte order.
    pub port: u16,
    /// [`FAMILY_V4`] or [`FAMILY_V6`] of the client's socket.
    pub family: u16,
    /// Padding; always zero.
    pub pad: u32,
}

/// Where a redirected connection was going (value of `SOCKET_DST` and `ORIG_DST`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OrigDst {
    /// The address words (see the crate doc).
    pub ip: [u32; 4],
    /// Port, host byte order.
    pub port: u16,
    /// [`FAMILY_V4`] or [`FAMILY_V6`] of the address.
    pub family: u16,
}

/// One end of a TCP connection inside a pod's netns, as that end sees it (key of
/// `INPOD_SOCKETS`, `PASSED` and `EXPECTED_PEERS`); the peer's key swaps local and remote.
/// A v4-mapped IPv6 socket is keyed as IPv4, as the IPv4 socket at its other end sees the
/// connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SockKey {
    /// `SO_NETNS_COOKIE` of the pod's network namespace (loopback addresses repeat in
    /// every pod).
    pub netns_cookie: u64,
    /// This end's address words (see the crate doc).
    pub local_ip: [u32; 4],
    /// The other end's address words.
    pub remote_ip: [u32; 4],
    /// This end's port, host byte order.
    pub local_port: u32,
    /// The other end's port, host byte order.
    pub remote_port: u32,
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u32,
    /// Padding; always zero.
    pub pad: u32,
}

impl SockKey {
    /// The key of the other end of the same connection.
    #[inline(always)]
    pub fn peer(&self) -> Self {
        Self {
            netns_cookie: self.netns_cookie,
            local_ip: self.remote_ip,
            remote_ip: self.local_ip,
            local_port: self.remote_port,
            remote_port: self.local_port,
            family: self.family,
            pad: 0,
        }
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: all of these are `repr(C)`, `Copy`, made of integers, with explicit padding:
    // every bit pattern is valid and no byte is uninitialised.
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::OutboundPod {}
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::InboundPod {}
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::PodIp {}
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::ListenerKey {}
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::ConnKey {}
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::OrigDst {}
    #[allow(unsafe_code)]
    unsafe impl aya::Pod for super::SockKey {}
}
