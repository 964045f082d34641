use super::*;
use crate::testing::TestCa;
use prometheus_client::registry::Registry;
use std::sync::atomic::Ordering;
use tokio::time::{sleep, Instant};

const LIFETIME: Duration = Duration::from_secs(1000);
/// The test CA backdates notBefore by 20 s, so the certificate's whole life is 1020 s.
const WHOLE: f64 = 1020.0;

fn manager(ca: &Arc<TestCa>, config: IdentityConfig) -> (IdentityManager, Registry) {
    *ca.lifetime.lock().unwrap() = LIFETIME;
    let mut registry = Registry::default();
    let metrics = IdentityMetrics::register(&mut registry);
    (IdentityManager::new(ca.clone(), config, metrics), registry)
}

fn no_jitter() -> IdentityConfig {
    IdentityConfig {
        renew_jitter_fraction: 0.0,
        ..IdentityConfig::default()
    }
}

fn metrics_text(r: &Registry) -> String {
    let mut s = String::new();
    prometheus_client::encoding::text::encode(&mut s, r).unwrap();
    s
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[tokio::test(start_paused = true)]
async fn fetches_ahead_once_per_identity_and_serves_it() {
    let ca = TestCa::new("cluster.local");
    let (m, registry) = manager(&ca, IdentityConfig::default());
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web-0", &web);
    m.pod_added("shop/web-1", &web);
    m.pod_added("shop/web-1", &web); // idempotent
    let cert = m.ready(&web).await.unwrap();
    assert_eq!(cert.identity(), &web);
    assert_eq!(
        ca.issued.load(Ordering::SeqCst),
        1,
        "one key and certificate per identity"
    );
    assert!(m.all_ready());
    assert_eq!(m.status()[0].pods, ["shop/web-0", "shop/web-1"]);
    let text = metrics_text(&registry);
    let expiry = super::unix_seconds(cert.not_after());
    assert!(text.contains(&format!(
        "identity_cert_expiration_timestamp_seconds{{identity=\"spiffe://cluster.local/ns/shop/sa/web\"}} {expiry}"
    )), "{text}");
    assert!(
        text.contains(
            "identity_cert_refresh_total{identity=\"spiffe://cluster.local/ns/shop/sa/web\"} 1"
        ),
        "{text}"
    );
    let other = ca.identity("shop", "db");
    assert!(
        m.ready(&other).await.is_err(),
        "an identity with no pod here is not served"
    );
}

#[tokio::test(start_paused = true)]
async fn renews_at_seventy_percent_of_the_lifetime_with_jitter_before_it() {
    let ca = TestCa::new("cluster.local");
    let (m, _) = manager(&ca, IdentityConfig::default());
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web-0", &web);
    let first = m.ready(&web).await.unwrap();
    let start = Instant::now();
    // The certificate arrived 20 s into its life; jitter takes at most 5 % off 70 %.
    sleep(secs(WHOLE * 0.65 - 20.0 - 1.0)).await;
    assert_eq!(
        ca.issued.load(Ordering::SeqCst),
        1,
        "renewed before 65 % of the lifetime"
    );
    sleep_until_secs(start, WHOLE * 0.70 - 20.0 + 1.0).await;
    assert_eq!(
        ca.issued.load(Ordering::SeqCst),
        2,
        "not renewed by 70 % of the lifetime"
    );
    let second = m.current(&web).unwrap();
    assert!(
        !Arc::ptr_eq(&first, &second),
        "the renewed certificate is served"
    );
}

async fn sleep_until_secs(start: Instant, s: f64) {
    tokio::time::sleep_until(start + secs(s)).await;
}

#[tokio::test(start_paused = true)]
async fn backs_off_while_the_ca_is_down_and_keeps_the_certificate_until_it_expires() {
    let ca = TestCa::new("cluster.local");
    let (m, registry) = manager(&ca, no_jitter());
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web-0", &web);
    m.ready(&web).await.unwrap();
    let start = Instant::now();
    ca.unavailable.store(true, Ordering::SeqCst);
    let renew = WHOLE * 0.7 - 20.0; // exact without jitter
    let calls = || ca.calls.load(Ordering::SeqCst);

    // notBefore is whole seconds, so the renewal falls up to 1 s before `renew`: find it.
    sleep_until_secs(start, renew - 1.5).await;
    assert_eq!(calls(), 1);
    while calls() == 1 {
        sleep(secs(0.01)).await;
    }
    let failed_at = Instant::now();
    assert!(
        failed_at - start <= secs(renew + 0.02),
        "renewal attempted late"
    );
    // Retries after 1 s, then 2 s, then 4 s (each up to 10 % longer).
    for (offset, want) in [
        (0.95, 2),
        (1.15, 3),
        (2.95, 3),
        (3.35, 4),
        (6.95, 4),
        (7.75, 5),
    ] {
        tokio::time::sleep_until(failed_at + secs(offset)).await;
        assert_eq!(calls(), want, "at first failure + {offset} s");
    }
    assert!(
        m.current(&web).is_some(),
        "the current certificate stays in use during the outage"
    );
    assert!(m.all_ready());

    // The delay grows to the 60 s cap and no further.
    sleep_until_secs(start, renew + 200.0).await;
    let before = calls();
    sleep_until_secs(start, renew + 200.0 + 66.5).await;
    assert!(calls() > before, "retries continue at most every 66 s");

    // Past notAfter the certificate is withdrawn.
    sleep_until_secs(start, WHOLE - 20.0 + 1.0).await;
    assert!(
        m.current(&web).is_none(),
        "an expired certificate is not served"
    );
    assert!(!m.all_ready());
    let text = metrics_text(&registry);
    assert!(text.contains("identity_cert_refresh_failure_total{identity=\"spiffe://cluster.local/ns/shop/sa/web\"}"), "{text}");

    // The CA comes back: the next retry (at most 66 s away) restores the identity.
    ca.unavailable.store(false, Ordering::SeqCst);
    sleep(secs(67.0)).await;
    assert!(m.current(&web).is_some());
    assert_eq!(ca.issued.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn drops_the_key_and_series_when_the_last_pod_leaves() {
    let ca = TestCa::new("cluster.local");
    let (m, registry) = manager(&ca, IdentityConfig::default());
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web-0", &web);
    m.pod_added("shop/web-1", &web);
    m.ready(&web).await.unwrap();
    m.pod_removed("shop/web-0");
    assert!(m.current(&web).is_some(), "another pod still runs as web");
    m.pod_removed("shop/web-1");
    m.pod_removed("shop/web-1"); // idempotent
    assert!(m.current(&web).is_none());
    assert!(m.status().is_empty());
    assert!(
        !metrics_text(&registry).contains("sa/web"),
        "series of a departed identity are dropped"
    );
    // Nothing renews a dropped identity.
    sleep(secs(WHOLE)).await;
    assert_eq!(ca.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_changes_identity_moves_between_entries() {
    let ca = TestCa::new("cluster.local");
    let (m, _) = manager(&ca, IdentityConfig::default());
    let (web, admin) = (ca.identity("shop", "web"), ca.identity("shop", "admin"));
    m.pod_added("shop/p", &web);
    m.pod_added("shop/p", &admin);
    let ids: Vec<_> = m.status().into_iter().map(|s| s.identity).collect();
    assert_eq!(ids, [admin]);
}

#[tokio::test(start_paused = true)]
async fn near_expiry_a_failed_renewal_is_retried_every_few_seconds() {
    let ca = TestCa::new("cluster.local");
    let (m, _) = manager(&ca, no_jitter());
    let web = ca.identity("shop", "web");
    m.pod_added("shop/web-0", &web);
    let cert = m.ready(&web).await.unwrap();
    ca.unavailable.store(true, Ordering::SeqCst);
    let calls = || ca.calls.load(Ordering::SeqCst);
    // Past the renewal the delay doubles to its 60 s cap — but never beyond a quarter of
    // the time the certificate has left.
    tokio::time::sleep_until(cert.expires_at() - secs(40.0)).await;
    let before = calls();
    tokio::time::sleep_until(cert.expires_at() - secs(1.0)).await;
    assert!(
        calls() - before >= 6,
        "{} retries in the last 39 s before expiry",
        calls() - before
    );
    assert!(m.current(&web).is_some(), "served until it expires");
    // The CA back a second before expiry: renewed in time.
    ca.unavailable.store(false, Ordering::SeqCst);
    tokio::time::sleep_until(cert.expires_at() + secs(0.5)).await;
    let now = m.current(&web).expect("renewed before the old one expired");
    assert!(!Arc::ptr_eq(&now, &cert));
}

/// The key and certificate `m` holds for `id`, as they would be read back from disk.
fn kept(m: &IdentityManager, id: &WorkloadIdentity) -> Restored {
    let cert = m.current(id).unwrap();
    let key = KeyPair::try_from(cert.key_pkcs8_der()).unwrap();
    let chain = cert.certified_key().cert.clone();
    let restored = WorkloadCertificate::restore(id, &key, chain).unwrap();
    Restored {
        key,
        cert: Arc::new(restored),
    }
}

#[tokio::test(start_paused = true)]
async fn a_restored_certificate_is_served_at_once_and_renewed_on_its_schedule() {
    let ca = TestCa::new("cluster.local");
    let (before, _) = manager(&ca, no_jitter());
    let web = ca.identity("shop", "web");
    before.pod_added("shop/web-0", &web);
    before.ready(&web).await.unwrap();
    let kept = kept(&before, &web);
    drop(before);

    // A new manager (the restarted proxy), the CA away.
    ca.unavailable.store(true, Ordering::SeqCst);
    let (m, registry) = manager(&ca, no_jitter());
    let mut changes = m.changes();
    m.restore(vec![kept]);
    assert_eq!(m.certificates().len(), 1, "held before any pod claims it");
    m.pod_added("shop/web-0", &web);
    let cert = m.current(&web).expect("served at once, without the CA");
    assert!(cert.restored());
    assert!(changes.has_changed().unwrap());
    changes.borrow_and_update();
    let calls = ca.calls.load(Ordering::SeqCst);
    sleep(secs(0.01)).await;
    let text = metrics_text(&registry);
    assert!(
        text.contains("identity_cert_expiration_timestamp_seconds{identity=\"spiffe://cluster.local/ns/shop/sa/web\"}"),
        "{text}"
    );

    // Renewed at 70 % of its life, with the same key.
    ca.unavailable.store(false, Ordering::SeqCst);
    sleep(secs(WHOLE * 0.7 - 20.0 - 5.0)).await;
    assert_eq!(ca.calls.load(Ordering::SeqCst), calls, "not renewed early");
    sleep(secs(10.0)).await;
    let renewed = m.current(&web).unwrap();
    assert!(!renewed.restored() && !Arc::ptr_eq(&renewed, &cert));
    assert_eq!(renewed.key_pkcs8_der(), cert.key_pkcs8_der());
    assert!(changes.has_changed().unwrap());

    // An expired restored certificate is not used: the first pod fetches anew.
    let (later, _) = manager(&ca, no_jitter());
    let old = kept_expired(&m, &web).await;
    later.restore(vec![old]);
    later.pod_added("shop/web-0", &web);
    assert!(later.current(&web).is_none());
    assert!(!later.ready(&web).await.unwrap().restored());
}

/// A restored certificate of `m`'s, once it has expired.
async fn kept_expired(m: &IdentityManager, id: &WorkloadIdentity) -> Restored {
    let r = kept(m, id);
    tokio::time::sleep_until(r.cert.expires_at() + secs(1.0)).await;
    r
}

/// A CA whose issuer can be switched, as the control plane's is by a rotation.
struct Switchable(std::sync::Mutex<Arc<TestCa>>);

impl CaClient for Switchable {
    fn certify(&self, id: &WorkloadIdentity, csr_der: Vec<u8>) -> super::ca::Certify {
        let ca = self.0.lock().unwrap().clone();
        ca.certify(id, csr_der)
    }
}

/// Waits until `id`'s certificate verifies under `bundle`.
async fn until_verified_by(
    m: &IdentityManager,
    id: &WorkloadIdentity,
    bundle: &crate::tls::TrustBundle,
) {
    let mut changes = m.changes();
    loop {
        if let Some(c) = m.current(id) {
            let now = rustls_pki_types::UnixTime::now();
            if crate::tls::verify_own_svid(bundle, &c.certified_key().cert, now).is_ok() {
                return;
            }
        }
        changes.changed().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn renew_gets_certificates_of_the_new_issuer_at_once_and_unverified_ones_only_when_asked() {
    let (old, new) = (TestCa::new("cluster.local"), TestCa::new("cluster.local"));
    let ca = Arc::new(Switchable(std::sync::Mutex::new(old.clone())));
    let mut registry = Registry::default();
    let m = IdentityManager::new(
        ca.clone(),
        no_jitter(),
        IdentityMetrics::register(&mut registry),
    );
    let (web, db) = (old.identity("shop", "web"), old.identity("shop", "db"));
    m.pod_added("shop/web-0", &web);
    m.pod_added("shop/db-0", &db);
    m.ready(&web).await.unwrap();
    m.ready(&db).await.unwrap();

    // The issuer switched: nothing renews by itself before its schedule.
    *ca.0.lock().unwrap() = new.clone();
    sleep(Duration::from_secs(10)).await;
    assert_eq!(new.issued.load(Ordering::SeqCst), 0);
    assert!(
        m.renew_unverified(&old.bundle()).is_empty(),
        "every certificate still verifies under the old root"
    );

    // Renewing every identity (`POST /renew-certificates`).
    let renewed = m.renew(|_| true);
    assert_eq!(renewed, vec![db.clone(), web.clone()]);
    until_verified_by(&m, &web, &new.bundle()).await;
    until_verified_by(&m, &db, &new.bundle()).await;
    assert_eq!(new.issued.load(Ordering::SeqCst), 2);
    let text = metrics_text(&registry);
    assert!(
        text.contains(
            "identity_cert_refresh_total{identity=\"spiffe://cluster.local/ns/shop/sa/web\"} 2"
        ),
        "{text}"
    );

    // A bundle without the new root: whatever it does not verify is renewed.
    *ca.0.lock().unwrap() = old.clone();
    assert_eq!(
        m.renew_unverified(&old.bundle()),
        vec![db.clone(), web.clone()]
    );
    until_verified_by(&m, &web, &old.bundle()).await;
    until_verified_by(&m, &db, &old.bundle()).await;
    assert!(m.renew_unverified(&old.bundle()).is_empty());
}

/// A CA that answers each request a second after it came, counting the requests it holds
/// at once.
struct SlowCa {
    ca: Arc<TestCa>,
    now: Arc<std::sync::atomic::AtomicUsize>,
    most: Arc<std::sync::atomic::AtomicUsize>,
}

impl CaClient for SlowCa {
    fn certify(&self, id: &WorkloadIdentity, csr_der: Vec<u8>) -> super::ca::Certify {
        let answer = self.ca.certify(id, csr_der);
        let (now, most) = (self.now.clone(), self.most.clone());
        Box::pin(async move {
            let held = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(held, Ordering::SeqCst);
            sleep(Duration::from_secs(1)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            answer.await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn asks_the_ca_for_at_most_so_many_certificates_at_once() {
    let ca = TestCa::new("cluster.local");
    *ca.lifetime.lock().unwrap() = LIFETIME;
    let slow = Arc::new(SlowCa {
        ca: ca.clone(),
        now: Arc::default(),
        most: Arc::default(),
    });
    let config = IdentityConfig {
        max_requests_in_flight: 4,
        ..no_jitter()
    };
    let m = IdentityManager::new(
        slow.clone(),
        config,
        IdentityMetrics::register(&mut Registry::default()),
    );
    // Twenty identities arrive at once, as on a proxy started beside their pods.
    let ids: Vec<_> = (0..20)
        .map(|i| ca.identity("shop", &format!("sa-{i}")))
        .collect();
    for (i, id) in ids.iter().enumerate() {
        m.pod_added(&format!("shop/pod-{i}"), id);
    }
    let start = Instant::now();
    for id in &ids {
        m.ready(id).await.unwrap();
    }
    assert_eq!(
        ca.issued.load(Ordering::SeqCst),
        20,
        "every identity served"
    );
    assert_eq!(
        slow.most.load(Ordering::SeqCst),
        4,
        "the CA held at most max_requests_in_flight requests at once"
    );
    // Five rounds of four, a second each.
    assert_eq!(start.elapsed().as_secs(), 5);
}
