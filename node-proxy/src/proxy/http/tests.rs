use super::*;

#[test]
fn each_cause_gets_its_status_and_names_itself() {
    for (e, status) in [
        (ProxyError::Client("bad".into()), 400),
        (ProxyError::Upstream("refused".into()), 502),
        (ProxyError::Unavailable("no ready endpoints".into()), 503),
        (ProxyError::Identity("no certificate".into()), 503),
        (ProxyError::Timeout("connecting".into()), 504),
        (ProxyError::Denied("not known".into()), 403),
        (ProxyError::NoRoute("no rule matches".into()), 404),
        (
            ProxyError::BadRoute("every backend has weight 0".into()),
            500,
        ),
        (ProxyError::Internal("oops".into()), 500),
    ] {
        let resp = error_response(&e);
        assert_eq!(resp.status().as_u16(), status, "{e}");
        assert_eq!(resp.headers()[ERROR_HEADER], e.to_string().as_str());
    }
}

#[test]
fn a_grpc_client_gets_the_proxys_own_errors_as_grpc_statuses() {
    for (e, code) in [
        (ProxyError::Timeout("slow".into()), "4"),
        (ProxyError::NoRoute("none".into()), "12"),
        (ProxyError::Unavailable("no endpoints".into()), "14"),
        (ProxyError::BadRoute("weights".into()), "13"),
    ] {
        let resp = grpc_answer(error_response(&e));
        assert_eq!(resp.status(), 200, "{e}");
        assert_eq!(resp.headers()["grpc-status"], code, "{e}");
        assert_eq!(resp.headers()["content-type"], "application/grpc");
        assert!(resp.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains(&e.to_string()[..5]));
    }
    // An upstream's own answer is left as it is.
    let mut upstream = Response::new(body::empty());
    *upstream.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    assert_eq!(grpc_answer(upstream).status(), 503);
}

#[test]
fn a_timeout_deep_in_the_cause_chain_is_found() {
    #[derive(Debug, thiserror::Error)]
    #[error("connect failed")]
    struct Wrapper(#[source] std::io::Error);
    let deep = Wrapper(std::io::Error::new(std::io::ErrorKind::TimedOut, "slow"));
    assert!(timed_out(&deep));
    let refused = Wrapper(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    assert!(!timed_out(&refused));
}
