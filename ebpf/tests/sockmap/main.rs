//! Sockmap on the in-pod hops in a real kernel: what docs/ARCHITECTURE.md says it must get
//! right, each shown here — both ends paired before the first byte and bytes in order, a
//! missing peer costing nothing but the shortcut (`SK_PASS`), `sendfile`, half-close, and
//! no entry left behind — with the "application" and the "proxy" as sockets of this
//! process in a pod netns and a cgroup made for each test (see `lab.rs`). `TCP_INFO` tells
//! whether TCP carried the bytes or `sk_msg` did. And what this kernel lacks: backpressure
//! across a redirected hop (bounded here by a budget per socket, after which it goes back
//! to TCP), and `splice` of redirected bytes (not handled: why sockmap is off by default).
//! Runs as root.

#![allow(clippy::unwrap_used, clippy::expect_used)]
// The kernel calls the tests need (sendfile, splice), each with its SAFETY line.
#![allow(unsafe_code)]

mod lab;
mod micro;

use ambit_ebpf::common::{maps, SockKey};
use lab::*;
use std::io::{ErrorKind, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

const MIB: usize = 1 << 20;
const LIMIT: Duration = Duration::from_secs(20);

/// `data` one way and `back` the other way at once; returns what each end read.
fn exchange(a: &TcpStream, b: &TcpStream, data: &[u8], back: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut a_w, mut a_r) = (a.try_clone().unwrap(), a.try_clone().unwrap());
    let (mut b_w, mut b_r) = (b.try_clone().unwrap(), b.try_clone().unwrap());
    std::thread::scope(|s| {
        s.spawn(|| write_all(&mut a_w, data));
        s.spawn(|| write_all(&mut b_w, back));
        let at_b = s.spawn(|| read_n(&mut b_r, data.len(), LIMIT));
        let at_a = read_n(&mut a_r, back.len(), LIMIT);
        (at_b.join().unwrap(), at_a)
    })
}

/// TCP carried no payload on `s` either way (what it shows: the SYN and FIN).
fn tcp_carried_nothing(s: &TcpStream) -> bool {
    let (acked, received) = tcp_bytes(s);
    acked <= 2 && received <= 2
}

#[test]
fn both_in_pod_hops_move_bytes_past_tcp_in_both_directions_and_not_when_off() {
    let (up, down) = (pattern(8 * MIB, 1), pattern(8 * MIB, 2));
    for on in [true, false] {
        let mut lab = Lab::new("bulk", on);
        // Both hops both ways for 8 MiB: past the default budget (see its test).
        if on {
            lab.r.set_sockmap_budget(u32::MAX).unwrap();
        }
        // Outbound: the application's redirected connection and the proxy's socket on 4140.
        let (app, proxy) = lab.outbound_hop();
        assert_eq!(lab.both_paired(&app), on, "outbound hop paired");
        let (at_proxy, at_app) = exchange(&app, &proxy, &up, &down);
        assert!(
            at_proxy == up && at_app == down,
            "bytes intact (sockmap {on})"
        );
        assert_eq!(tcp_carried_nothing(&app), on, "{:?}", tcp_bytes(&app));
        assert_eq!(tcp_carried_nothing(&proxy), on, "{:?}", tcp_bytes(&proxy));
        if !on {
            assert_eq!(tcp_bytes(&app).1, down.len() as u64, "TCP carried it all");
        }
        // Delivery: the proxy connecting to the application at the pod's own address.
        let listener = lab.app_listener(8080);
        let (proxy, app) = lab.delivery_hop(&listener);
        assert_eq!(lab.both_paired(&app), on, "delivery hop paired");
        let (at_app, at_proxy) = exchange(&proxy, &app, &down, &up);
        assert!(
            at_app == down && at_proxy == up,
            "bytes intact (sockmap {on})"
        );
        assert_eq!(tcp_carried_nothing(&proxy), on, "{:?}", tcp_bytes(&proxy));
        assert_eq!(tcp_carried_nothing(&app), on, "{:?}", tcp_bytes(&app));
        if !on {
            assert!(lab.paired().is_empty(), "off: nothing paired");
        }
    }
}

#[test]
fn ipv6_and_v4_mapped_hops_are_paired_too() {
    let lab = Lab::new("six", true);
    let data = pattern(MIB, 7);
    for dst in ["[fd12:250::9]:80", "[::ffff:10.212.250.9]:80"] {
        let (app, proxy) = lab.outbound_hop6(dst.parse().unwrap());
        assert!(lab.both_paired(&app), "{dst}: {:?}", lab.paired());
        let (at_proxy, at_app) = exchange(&app, &proxy, &data, &data);
        assert!(at_proxy == data && at_app == data, "{dst}");
        assert!(tcp_carried_nothing(&app), "{dst}: {:?}", tcp_bytes(&app));
    }
    // Delivery over IPv6, from the pod's IPv6 address to itself.
    let listener = listen6_in(&lab.pod, SocketAddr::new(lab.pod_ip6().into(), 8087));
    let (proxy, app) = lab.delivery_hop(&listener);
    assert!(lab.both_paired(&app), "{:?}", lab.paired());
    let (at_app, at_proxy) = exchange(&proxy, &app, &data, &data);
    assert!(at_proxy == data && at_app == data);
    assert!(tcp_carried_nothing(&proxy), "{:?}", tcp_bytes(&proxy));
}

#[test]
fn bytes_sent_right_after_connect_arrive_in_order() {
    let lab = Lab::new("order", true);
    // Each end writes at once, in many small writes, before the other has read anything.
    let numbers = |n: u32| -> Vec<u8> { (0..n).flat_map(u32::to_be_bytes).collect() };
    let listener = lab.app_listener(8081);
    for i in 0..50 {
        let (mut app, mut proxy) = lab.outbound_hop();
        let (mut d_proxy, mut d_app) = lab.delivery_hop(&listener);
        for n in 0..200u32 {
            app.write_all(&n.to_be_bytes()).unwrap();
            d_proxy.write_all(&n.to_be_bytes()).unwrap();
            proxy.write_all(&n.to_be_bytes()).unwrap();
            d_app.write_all(&n.to_be_bytes()).unwrap();
        }
        for (s, name) in [
            (&mut proxy, "app to proxy"),
            (&mut app, "proxy to app"),
            (&mut d_app, "delivery: proxy to app"),
            (&mut d_proxy, "delivery: app to proxy"),
        ] {
            assert_eq!(
                read_n(s, 800, LIMIT),
                numbers(200),
                "{name}, connection {i}"
            );
        }
        assert!(tcp_carried_nothing(&app) && tcp_carried_nothing(&d_proxy));
    }
}

/// The pinned maps, opened as another process would (`bpftool`, a second proxy).
fn pinned_sockets(lab: &Lab) -> aya::maps::SockHash<aya::maps::MapData, SockKey> {
    let data = aya::maps::MapData::from_pin(lab.pin_dir.join(maps::INPOD_SOCKETS)).unwrap();
    aya::maps::SockHash::try_from(aya::maps::Map::SockHash(data)).unwrap()
}

fn pinned_passed(lab: &Lab) -> aya::maps::HashMap<aya::maps::MapData, SockKey, u32> {
    let data = aya::maps::MapData::from_pin(lab.pin_dir.join(maps::PASSED)).unwrap();
    aya::maps::HashMap::try_from(aya::maps::Map::LruHashMap(data)).unwrap()
}

/// The peer joins the map after bytes went to it by TCP — what happens when its
/// `PASSIVE_ESTABLISHED` runs late (the handshake's last ACK processed after the other end
/// has written). The socket that sent by TCP must keep to TCP: with its mark in `PASSED`
/// removed, the kernel hands the reader the later, redirected bytes first.
#[test]
fn a_socket_that_sent_by_tcp_keeps_to_tcp_when_its_peer_joins_later() {
    let lab = Lab::new("late", true);
    let mut sockets = pinned_sockets(&lab);
    let mut passed = pinned_passed(&lab);
    for keep_to_tcp in [true, false] {
        let (mut app, mut proxy) = lab.outbound_hop();
        let proxy_key = key_of(lab.netns_cookie, &proxy);
        sockets.remove(&proxy_key).unwrap();
        app.write_all(b"first,").unwrap();
        // The first bytes wait, unread, in the proxy's TCP receive queue.
        assert!(eventually(LIMIT, || tcp_bytes(&proxy).1 == 6));
        sockets.insert(proxy_key, proxy.as_raw_fd(), 0).unwrap();
        let app_key = key_of(lab.netns_cookie, &app);
        assert!(
            passed.get(&app_key, 0).is_ok(),
            "the application's socket is marked"
        );
        if !keep_to_tcp {
            passed.remove(&app_key).unwrap();
        }
        app.write_all(b"second").unwrap();
        app.shutdown(Shutdown::Write).unwrap();
        let got = read_all(&mut proxy, LIMIT);
        if keep_to_tcp {
            assert_eq!(got, b"first,second", "in order");
            // (and the FIN's sequence number)
            assert!((12..=13).contains(&tcp_bytes(&proxy).1), "all of it by TCP");
        } else {
            assert_eq!(
                got, b"secondfirst,",
                "the kernel's reordering the mark prevents"
            );
        }
    }
}

#[test]
fn bytes_for_a_peer_missing_from_the_map_take_tcp_and_arrive() {
    let lab = Lab::new("missing", true);
    let mut sockets = pinned_sockets(&lab);
    let data = pattern(2 * MIB, 3);
    // The proxy's end is missing (a peer not under `sockops`, a full map): the
    // application's bytes take TCP — `bpf_msg_redirect_hash` said SK_DROP, the program
    // SK_PASS — and the proxy's bytes, not run through `sk_msg` at all, too.
    let (app, proxy) = lab.outbound_hop();
    sockets.remove(&key_of(lab.netns_cookie, &proxy)).unwrap();
    let (at_proxy, at_app) = exchange(&app, &proxy, &data, &data);
    assert!(at_proxy == data && at_app == data);
    assert_eq!(tcp_bytes(&proxy).1, data.len() as u64, "by TCP");
    assert!(pinned_passed(&lab)
        .get(&key_of(lab.netns_cookie, &app), 0)
        .is_ok());

    // A peer that closed: the write fails as over TCP (reset), it is not swallowed.
    let (mut app, proxy) = lab.outbound_hop();
    drop(proxy);
    let failed = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        app.write_all(b"anyone?").is_err()
    });
    assert!(failed, "writing to a closed peer fails");
}

/// `sendfile(2)` of `len` bytes of `file` from offset 0 to `out`.
fn sendfile_all(out: &TcpStream, file: &std::fs::File, len: usize) {
    let mut offset: libc::off_t = 0;
    while (offset as usize) < len {
        // SAFETY: both descriptors are open for the call; `offset` is valid for writes.
        let n = unsafe {
            libc::sendfile(
                out.as_raw_fd(),
                file.as_raw_fd(),
                &mut offset,
                len - offset as usize,
            )
        };
        assert!(n > 0, "sendfile: {}", std::io::Error::last_os_error());
    }
}

#[test]
fn sendfile_between_writes_arrives_whole_and_in_order_both_ways() {
    let mut lab = Lab::new("sendfile", true);
    // 5 MiB each way: past the default budget (see its test).
    lab.r.set_sockmap_budget(u32::MAX).unwrap();
    let body = pattern(5 * MIB + 123, 4);
    let path = std::env::temp_dir().join(format!("ambit-sockmap-{}", std::process::id()));
    std::fs::write(&path, &body).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    let listener = lab.app_listener(8082);
    let (app, proxy) = lab.outbound_hop();
    let (d_proxy, d_app) = lab.delivery_hop(&listener);
    // As nginx answers: headers written, the body sent from the file, then more written.
    for (from, to) in [
        (&app, &proxy),
        (&proxy, &app),
        (&d_app, &d_proxy),
        (&d_proxy, &d_app),
    ] {
        let mut w = from.try_clone().unwrap();
        let mut r = to.try_clone().unwrap();
        let expected: Vec<u8> = [&b"head:"[..], &body, b":tail"].concat();
        let reader = std::thread::spawn(move || read_n(&mut r, expected.len(), LIMIT) == expected);
        w.write_all(b"head:").unwrap();
        sendfile_all(from, &file, body.len());
        w.write_all(b":tail").unwrap();
        assert!(reader.join().unwrap(), "whole and in order");
        assert!(tcp_carried_nothing(from), "{:?}", tcp_bytes(from));
    }
}

#[test]
fn half_close_reaches_the_peer_as_eof_and_the_other_direction_keeps_working() {
    let lab = Lab::new("halfclose", true);
    // The application sends its request and shuts its side; the proxy reads to EOF, then
    // answers in pieces and shuts its side.
    let (mut app, mut proxy) = lab.outbound_hop();
    app.write_all(b"request").unwrap();
    app.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut proxy, LIMIT), b"request");
    for piece in [&b"answer "[..], b"after ", b"half-close"] {
        proxy.write_all(piece).unwrap();
    }
    proxy.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut app, LIMIT), b"answer after half-close");
    assert!(tcp_carried_nothing(&app));

    // The other way round, on the delivery hop: the proxy shuts first, the application
    // keeps sending.
    let listener = lab.app_listener(8083);
    let (mut proxy, mut app) = lab.delivery_hop(&listener);
    proxy.write_all(b"all of it").unwrap();
    proxy.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut app, LIMIT), b"all of it");
    let reply = pattern(3 * MIB, 5);
    write_all(&mut app, &reply);
    app.shutdown(Shutdown::Write).unwrap();
    assert!(read_all(&mut proxy, LIMIT) == reply);

    // Both sides shut and the proxy gone before the application reads a byte (its socket
    // in TIME_WAIT, the proxy's closed): what was sent is still there to read.
    let (mut app, mut proxy) = lab.outbound_hop();
    app.write_all(b"q").unwrap();
    app.shutdown(Shutdown::Write).unwrap();
    assert_eq!(read_all(&mut proxy, LIMIT), b"q");
    proxy
        .write_all(b"the answer, unread until both sides closed")
        .unwrap();
    proxy.shutdown(Shutdown::Write).unwrap();
    drop(proxy);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        read_all(&mut app, LIMIT),
        b"the answer, unread until both sides closed"
    );
}

#[test]
fn closed_sockets_leave_the_map() {
    let lab = Lab::new("close", true);
    let listener = lab.app_listener(8084);
    let mut open = Vec::new();
    for _ in 0..25 {
        open.push(lab.outbound_hop());
        open.push(lab.delivery_hop(&listener));
    }
    assert_eq!(lab.paired().len(), 100, "both ends of 50 hops");
    // One end closed: its entry goes at once, its peer's stays until it closes too.
    let (a, b) = open.pop().unwrap();
    let (a_key, b_key) = (key_of(lab.netns_cookie, &a), key_of(lab.netns_cookie, &b));
    drop(a);
    let paired = lab.paired();
    assert!(!paired.contains(&a_key) && paired.contains(&b_key));
    assert_eq!(paired.len(), 99);
    drop(b);
    drop(open);
    assert!(lab.paired().is_empty(), "{:?}", lab.paired());
}

#[test]
fn only_the_in_pod_hops_are_paired_and_the_switch_stops_new_pairs() {
    let mut lab = Lab::new("only", true);
    // The application talking to itself at its own address (on a skip-outbound port, or
    // it would go to the proxy): neither end is the proxy's.
    let listener = lab.app_listener(SKIP_OUTBOUND.0);
    let addr = listener.local_addr().unwrap();
    let client = lab.in_pod(move || TcpStream::connect(addr).unwrap());
    let server = accept_within(&listener);
    // And to loopback on another port.
    let local = listen_in(&lab.pod, "127.0.0.1:8086".parse().unwrap());
    let lo = lab.in_pod(|| TcpStream::connect("127.0.0.1:8086").unwrap());
    let lo_server = accept_within(&local);
    let (in_hop, _proxy) = lab.outbound_hop();
    let paired = lab.paired();
    for s in [&client, &server, &lo, &lo_server] {
        assert!(!paired.contains(&key_of(lab.netns_cookie, s)), "{s:?}");
    }
    assert_eq!(paired.len(), 2, "only the in-pod hop: {paired:?}");
    let (mut c, mut sv) = (client, server);
    c.write_all(b"self").unwrap();
    assert_eq!(read_n(&mut sv, 4, LIMIT), b"self");
    sv.write_all(b"back").unwrap();
    assert_eq!(read_n(&mut c, 4, LIMIT), b"back");

    // Off: hops made from now on are not paired; the one made before keeps its path.
    lab.r.disable_sockmap().unwrap();
    let (app, _proxy2) = lab.outbound_hop();
    assert!(!lab.both_paired(&app));
    assert!(lab.both_paired(&in_hop));
}

/// The proxy in a cgroup of its own, outside the programs' (as in these tests' in-process
/// proxies and the benchmarks): `sockops` is attached to its cgroup too, so its sockets
/// are paired; the application is a process of its own in the programs' cgroup.
#[test]
fn a_proxy_outside_the_programs_cgroup_is_paired_through_its_own() {
    let lab = Lab::with_proxy_outside("outside");
    const SCRIPT: &str = r#"
import socket, sys
s = socket.create_connection(("10.212.250.9", 80), timeout=10)
s.sendall(b"x" * 1000000)
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
print(len(got))
"#;
    let procs = lab.cgroup.join("cgroup.procs");
    let app = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"echo $$ > "$0" && exec ip netns exec "$1" python3 -c "$2""#)
        .arg(procs)
        .args([&lab.pod, SCRIPT])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut proxy = accept_within(&lab.outbound);
    assert!(eventually(LIMIT, || {
        let paired = lab.paired();
        let key = key_of(lab.netns_cookie, &proxy);
        paired.contains(&key) && paired.contains(&key.peer())
    }));
    assert_eq!(read_all(&mut proxy, LIMIT).len(), 1_000_000);
    write_all(&mut proxy, &pattern(MIB, 6));
    proxy.shutdown(Shutdown::Write).unwrap();
    let out = app.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), MIB.to_string());
    assert!(tcp_carried_nothing(&proxy), "{:?}", tcp_bytes(&proxy));
}

/// Fills `s` without reading the other end, up to `cap` bytes: how much it took before
/// `EAGAIN`, in a pattern that shows any reordering.
fn fill(s: &mut TcpStream, cap: usize) -> usize {
    s.set_nonblocking(true).unwrap();
    let data = pattern(cap, 8);
    let mut queued = 0;
    while queued < cap {
        match s.write(&data[queued..(queued + 65536).min(cap)]) {
            Ok(n) => queued += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => panic!("after {queued}: {e}"),
        }
    }
    s.set_nonblocking(false).unwrap();
    queued
}

/// The kernel gives a redirected hop no backpressure: a writer whose reader does not read
/// has everything taken (64 MiB here, up to the node's TCP memory: an iperf3 upload
/// through a proxy got `ENOMEM` that way). With the budget, a socket that has moved its
/// 4 MiB by `sk_msg` goes back to TCP for good, and TCP holds it back; the reader gets
/// every byte in order — the redirected ones first. The price: a reader that keeps up
/// gets the rest by TCP too.
#[test]
fn a_socket_past_its_budget_goes_back_to_tcp_and_tcp_holds_it_back() {
    const CAP: usize = 64 * MIB;
    let budget = ambit_ebpf::common::SOCKMAP_BUDGET as usize;
    let mut lab = Lab::new("budget", true);
    // No reader.
    let (mut app, mut proxy) = lab.outbound_hop();
    let app_key = key_of(lab.netns_cookie, &app);
    let queued = fill(&mut app, CAP);
    assert!(queued < budget + 12 * MIB, "held back at {queued}");
    let spent = lab.r.sockmap_redirected(&app_key).unwrap() as usize;
    assert!(
        spent <= budget && spent > budget - MIB,
        "{spent} bytes by sk_msg"
    );
    assert!(
        pinned_passed(&lab).get(&app_key, 0).is_ok(),
        "the writer keeps to TCP"
    );
    assert!(
        read_n(&mut proxy, queued, LIMIT) == pattern(CAP, 8)[..queued],
        "in order"
    );
    assert_eq!(
        tcp_bytes(&proxy).1 as usize,
        queued - spent,
        "the rest by TCP"
    );
    // The other way has a budget of its own, untouched.
    proxy.write_all(b"still paired").unwrap();
    assert_eq!(read_n(&mut app, 12, LIMIT), b"still paired");
    assert_eq!(tcp_bytes(&app).1, 0, "{:?}", tcp_bytes(&app));

    // A reader that keeps up: the first 4 MiB by sk_msg, the rest by TCP, all in order.
    let (app, proxy) = lab.outbound_hop();
    let data = pattern(3 * budget, 9);
    let (at_proxy, _) = exchange(&app, &proxy, &data, b"");
    assert!(at_proxy == data, "in order across the switch");
    let by_tcp = tcp_bytes(&proxy).1 as usize;
    assert!(
        by_tcp >= 2 * budget && by_tcp < data.len(),
        "{by_tcp} by TCP"
    );

    // Without the budget: no backpressure at all.
    lab.r.set_sockmap_budget(u32::MAX).unwrap();
    let (mut app, mut proxy) = lab.outbound_hop();
    assert_eq!(fill(&mut app, CAP), CAP, "{CAP} bytes taken, none read");
    assert_eq!(tcp_bytes(&proxy).1, 0);
    assert!(read_n(&mut proxy, CAP, LIMIT) == pattern(CAP, 8));
}

/// `splice(2)` cannot read redirected bytes on this kernel: it answers `EAGAIN` while
/// `read` gets them. An application that splices from its socket would stall — why
/// sockmap is off by default. Should a kernel change that, this test says so.
#[test]
fn known_limit_splice_cannot_read_redirected_bytes() {
    for on in [false, true] {
        let lab = Lab::new("splice", on);
        let (mut app, mut proxy) = lab.outbound_hop();
        app.write_all(b"spliced?").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let (pipe_r, pipe_w) = nix::unistd::pipe().unwrap();
        proxy.set_nonblocking(true).unwrap();
        // SAFETY: both descriptors are open for the call; no offsets.
        let spliced = unsafe {
            libc::splice(
                proxy.as_raw_fd(),
                std::ptr::null_mut(),
                pipe_w.as_raw_fd(),
                std::ptr::null_mut(),
                64,
                libc::SPLICE_F_NONBLOCK,
            )
        };
        drop(pipe_r);
        proxy.set_nonblocking(false).unwrap();
        if on {
            assert_eq!(spliced, -1, "splice sees nothing of the redirected bytes");
            assert_eq!(read_n(&mut proxy, 8, LIMIT), b"spliced?", "read does");
        } else {
            assert_eq!(spliced, 8);
        }
    }
}
