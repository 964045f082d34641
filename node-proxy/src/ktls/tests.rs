//! Kernel TLS against a real rustls peer over loopback. Where the kernel has no TLS (the
//! host kernel of these machines), the tests prove the refusal and its message instead;
//! with `AMBIT_KERNEL_TLS=on` (the KVM guest pass in `scripts/test.sh`) the kernel must
//! have it, so the kTLS branch cannot be skipped there.

use super::*;
use crate::testing::TestCa;
use crate::tls;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Whether this run requires kernel TLS (`AMBIT_KERNEL_TLS=on`, as the proxy's flag).
fn required() -> bool {
    std::env::var(crate::config::env::KERNEL_TLS).is_ok_and(|v| v == "on")
}

/// `Some(())` when the kernel has TLS; otherwise checks that the refusal says why and what
/// to do, and that it was allowed to be missing.
fn kernel_tls() -> Option<()> {
    match probe() {
        Ok(()) => Some(()),
        Err(why) => {
            assert!(
                !required(),
                "AMBIT_KERNEL_TLS=on, but this kernel has no TLS: {why}"
            );
            assert!(
                why.contains("CONFIG_TLS") && why.contains("modprobe tls"),
                "{why}"
            );
            None
        }
    }
}

async fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
    let (a, b) = tokio::join!(TcpStream::connect(addr), l.accept());
    (
        a.unwrap_or_else(|e| panic!("{e}")),
        b.unwrap_or_else(|e| panic!("{e}")).0,
    )
}

/// A TLS 1.3 connection over loopback, as the mesh makes one: the client side handed to
/// kernel TLS (returned as its socket), the server side left to rustls in user space.
async fn ktls_client_and_rustls_server() -> (TcpStream, tokio_rustls::server::TlsStream<TcpStream>)
{
    let ca = TestCa::new("cluster.local");
    let (cli, srv) = (ca.identity("a", "cli"), ca.identity("b", "srv"));
    let mut client = tls::client_config(&ca.bundle(), ca.certified_key(&cli), vec![srv.clone()])
        .unwrap_or_else(|e| panic!("{e}"));
    client.enable_secret_extraction = true;
    let mut server =
        tls::server_config(&ca.bundle(), ca.certified_key(&srv)).unwrap_or_else(|e| panic!("{e}"));
    server.send_tls13_tickets = 0;
    let (c, s) = pair().await;
    let name = rustls_pki_types::ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let (c, s) = tokio::join!(
        tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, c),
        tokio_rustls::TlsAcceptor::from(Arc::new(server)).accept(s),
    );
    let (c, s) = (
        c.unwrap_or_else(|e| panic!("{e}")),
        s.unwrap_or_else(|e| panic!("{e}")),
    );
    let (tcp, conn) = c.into_inner();
    let secrets = conn
        .dangerous_extract_secrets()
        .unwrap_or_else(|e| panic!("{e}"));
    install(&tcp, &secrets).unwrap_or_else(|e| panic!("{e}"));
    (tcp, s)
}

#[test]
fn the_decision_follows_the_flag_sockmap_and_the_kernel() {
    let off = KernelTls::decide(Mode::Off, false).unwrap_or_else(|e| panic!("{e}"));
    assert!(!off.enabled());
    assert_eq!(off.config_dump()["why"], "off (--kernel-tls off)");
    // Sockmap's in-pod hops cannot be spliced: auto steps aside, on refuses to start.
    let auto = KernelTls::decide(Mode::Auto, true).unwrap_or_else(|e| panic!("{e}"));
    assert!(!auto.enabled());
    assert!(auto.to_string().contains("sockmap is on"), "{auto}");
    let err = KernelTls::decide(Mode::On, true).map(|_| ()).unwrap_err();
    assert!(err.contains("turn one of them off"), "{err}");
    // What the kernel can do decides the rest.
    let auto = KernelTls::decide(Mode::Auto, false).unwrap_or_else(|e| panic!("{e}"));
    let on = KernelTls::decide(Mode::On, false);
    match kernel_tls() {
        Some(()) => {
            assert!(auto.enabled(), "{auto}");
            assert!(on.is_ok_and(|k| k.enabled()));
        }
        None => {
            assert!(!auto.enabled());
            assert!(auto.to_string().contains("CONFIG_TLS"), "{auto}");
            let err = on.map(|_| ()).unwrap_err();
            assert!(err.starts_with("--kernel-tls on: "), "{err}");
        }
    }
}

#[tokio::test]
async fn install_refuses_clearly_where_the_kernel_has_no_tls() {
    if kernel_tls().is_some() {
        return;
    }
    // The refusal on a real connection names the step and the errno.
    let (a, _b) = pair().await;
    let secrets = rustls::ExtractedSecrets {
        tx: (0, aes128()),
        rx: (0, aes128()),
    };
    let err = install(&a, &secrets).unwrap_err();
    assert!(
        err.to_string().starts_with("setsockopt(TCP_ULP, \"tls\")"),
        "{err}"
    );
}

fn aes128() -> ConnectionTrafficSecrets {
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&[3; 16]);
    ConnectionTrafficSecrets::Aes256Gcm {
        key: rustls::crypto::cipher::AeadKey::from(key),
        iv: rustls::crypto::cipher::Iv::new([1; 12]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_tls_socket_speaks_tls_with_a_rustls_peer_and_ends_cleanly() {
    if kernel_tls().is_none() {
        return;
    }
    let (mut ktls, mut peer) = ktls_client_and_rustls_server().await;
    // Plain writes and reads on the socket are TLS records now.
    ktls.write_all(b"hello")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let mut got = [0u8; 5];
    peer.read_exact(&mut got)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&got, b"hello");
    peer.write_all(b"world")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    peer.flush().await.unwrap_or_else(|e| panic!("{e}"));
    ktls.read_exact(&mut got)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(&got, b"world");
    // The peer's close_notify is a control record: recognised as the end.
    peer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    ktls.readable().await.unwrap_or_else(|e| panic!("{e}"));
    assert!(read_control(&ktls).is_ok());
    // Ours reaches rustls as a clean end (not "peer closed without close_notify").
    send_close_notify(&ktls).unwrap_or_else(|e| panic!("{e}"));
    let mut rest = Vec::new();
    peer.read_to_end(&mut rest)
        .await
        .unwrap_or_else(|e| panic!("rustls saw an unclean end: {e}"));
    assert!(rest.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn splice_relays_both_ways_passing_half_closes_and_counts_bytes() {
    if kernel_tls().is_none() {
        return;
    }
    let (ktls, mut peer) = ktls_client_and_rustls_server().await;
    let (mut app, proxy_side) = pair().await;
    let relay =
        tokio::spawn(async move { splice::relay(&proxy_side, &ktls, splice::Ktls::Server).await });
    // 3 MiB up, then the application half-closes: the peer reads it all and a clean end.
    let up: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    let down: Vec<u8> = (0..700_000).map(|i: u32| (i % 241) as u8).collect();
    let writer = {
        let up = up.clone();
        async move {
            app.write_all(&up).await?;
            app.shutdown().await?;
            Ok::<_, std::io::Error>(app)
        }
    };
    let reader = async {
        let mut got = Vec::new();
        peer.read_to_end(&mut got).await.map(|_| got)
    };
    let (app, got) = tokio::join!(writer, reader);
    let mut app = app.unwrap_or_else(|e| panic!("{e}"));
    assert!(got.unwrap_or_else(|e| panic!("rustls peer: {e}")) == up);
    // The other direction still flows after the half-close, then ends too.
    peer.write_all(&down)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    peer.shutdown().await.unwrap_or_else(|e| panic!("{e}"));
    let mut got = Vec::new();
    app.read_to_end(&mut got)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(got == down);
    let (from_app, to_app) = relay.await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((from_app, to_app), (up.len() as u64, down.len() as u64));
}
