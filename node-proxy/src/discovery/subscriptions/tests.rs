use super::*;
use crate::discovery::Destination;
use ambit_api::proto::discovery as pb;

fn ip(s: &str) -> Target {
    Target::Addr(s.parse().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_destination_is_subscribed_on_first_use_and_dropped_once_idle() {
    let subs = Subscriptions::default();
    let mut changes = subs.changes();
    subs.touch(&ip("10.96.0.10"));
    assert!(changes.has_changed().unwrap(), "a new target is announced");
    changes.mark_unchanged();
    subs.touch(&ip("10.96.0.10"));
    assert!(
        !changes.has_changed().unwrap(),
        "a use of a known one is not"
    );
    subs.touch(&Target::Service("shop/web".into()));
    changes.mark_unchanged();
    tokio::time::advance(Duration::from_secs(200)).await;
    // Used again: stays; the other goes after its idle time.
    subs.touch(&ip("10.96.0.10"));
    tokio::time::advance(Duration::from_secs(200)).await;
    assert_eq!(
        subs.expire(Duration::from_secs(300)),
        [Target::Service("shop/web".into())]
    );
    assert!(changes.has_changed().unwrap());
    assert_eq!(
        subs.current().into_iter().collect::<Vec<_>>(),
        [ip("10.96.0.10")]
    );
    tokio::time::advance(Duration::from_secs(200)).await;
    assert_eq!(subs.expire(Duration::from_secs(300)), [ip("10.96.0.10")]);
    assert!(subs.current().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_wait_ends_when_discovery_answers_or_after_its_bound() {
    let subs = Subscriptions::default();
    let (tx, rx) = watch::channel(Arc::new(DiscoveryState::default()));
    let target = ip("192.0.2.1");
    let addr = "192.0.2.1:443".parse().unwrap();
    // No answer: refused after the bound, and counted.
    let started = Instant::now();
    let err = subs
        .wait(&rx, &target, Duration::from_secs(3), |s| s.lookup(addr))
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::Timeout { .. }), "{err}");
    assert_eq!(started.elapsed(), Duration::from_secs(3));
    assert!(
        err.to_string().contains("the control plane is unreachable"),
        "{err}"
    );
    assert_eq!(
        subs.current().into_iter().collect::<Vec<_>>(),
        std::slice::from_ref(&target),
        "subscribed"
    );
    // The answer arrives while a connection waits (past the unanswered one's timeout).
    tokio::time::advance(Duration::from_secs(3)).await;
    let waiting = {
        let subs = subs.clone();
        let rx = rx.clone();
        let target = target.clone();
        tokio::spawn(async move {
            subs.wait(&rx, &target, Duration::from_secs(3), |s| s.lookup(addr))
                .await
        })
    };
    tokio::time::advance(Duration::from_millis(5)).await;
    tx.send_modify(|s| {
        Arc::make_mut(s).apply(pb::Update {
            resolutions: vec![pb::Resolution {
                target: "192.0.2.1".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
    });
    let got = waiting.await.unwrap().unwrap();
    assert_eq!(got, Destination::Unknown(addr));
    // Known: no wait at all.
    let started = Instant::now();
    subs.wait(&rx, &target, Duration::from_secs(3), |s| s.lookup(addr))
        .await
        .unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn after_an_unanswered_wait_the_same_destination_fails_at_once_for_a_while() {
    let subs = Subscriptions::default();
    let (_tx, rx) = watch::channel(Arc::new(DiscoveryState::default()));
    let target = ip("192.0.2.9");
    let addr = "192.0.2.9:80".parse().unwrap();
    let timeout = Duration::from_secs(3);
    assert!(subs
        .wait(&rx, &target, timeout, |s| s.lookup(addr))
        .await
        .is_err());
    // Within the timeout of that: no second wait (a connection's later requests, a
    // client retrying in a loop).
    let started = Instant::now();
    let err = subs
        .wait(&rx, &target, timeout, |s| s.lookup(addr))
        .await
        .unwrap_err();
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert!(err.to_string().contains("no answer to a lookup"), "{err}");
    // Later, it is waited for again.
    tokio::time::advance(timeout).await;
    let started = Instant::now();
    assert!(subs
        .wait(&rx, &target, timeout, |s| s.lookup(addr))
        .await
        .is_err());
    assert_eq!(started.elapsed(), timeout);
}

#[tokio::test(start_paused = true)]
async fn no_more_than_the_bound_is_subscribed() {
    let subs = Subscriptions::default();
    for i in 0..MAX_SUBSCRIPTIONS {
        assert!(subs.touch(&Target::Addr(std::net::Ipv4Addr::from(i as u32).into())));
    }
    let (_tx, rx) = watch::channel(Arc::new(DiscoveryState::default()));
    let one_more = ip("203.0.113.1");
    let addr = "203.0.113.1:80".parse().unwrap();
    let err = subs
        .wait(&rx, &one_more, Duration::from_secs(3), |s| s.lookup(addr))
        .await
        .unwrap_err();
    assert!(matches!(err, WaitError::TooMany(_)), "{err}");
    assert_eq!(subs.current().len(), MAX_SUBSCRIPTIONS);
    // A subscribed one is still used.
    assert!(subs.touch(&Target::Addr(std::net::Ipv4Addr::from(7u32).into())));
}
