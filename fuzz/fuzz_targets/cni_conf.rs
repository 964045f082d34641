//! The CNI plugin's stdin (`ambit_cni`): the network configuration JSON with its
//! `prevResult`, as `NetConf::parse` reads it and as the plugin's ADD, DEL and VERSION
//! answer it (for an invocation that is not a Kubernetes pod's, so that nothing is sent to
//! a proxy or opened).
//!
//! Input: the bytes on stdin.
//!
//! Invariants: no panic; a configuration that parses has a supported version; ADD passes
//! `prevResult` through unchanged (only `cniVersion` added when it is missing) or fails
//! with the spec's error JSON; DEL of such an invocation succeeds with nothing on stdout;
//! every error is the spec's JSON in a supported version; VERSION always answers.
#![no_main]

use ambit_cni::conf::{Env, NetConf, SUPPORTED_VERSIONS};
use ambit_cni::plugin::run;
use ambit_fuzz::quiet_stderr;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// The environment of an invocation for a sandbox that is not a Kubernetes pod.
fn env(command: &str) -> Env {
    Env::from_vars(|k| {
        Some(
            match k {
                "CNI_COMMAND" => command,
                "CNI_CONTAINERID" => "fuzz",
                "CNI_NETNS" => "/nonexistent/fuzz-netns",
                "CNI_IFNAME" => "eth0",
                "CNI_ARGS" => "IgnoreUnknown=1",
                _ => return None,
            }
            .to_string(),
        )
    })
}

/// Checks a failure's stdout: the spec's error JSON.
fn check_error(stdout: &str) {
    let e: Value = serde_json::from_str(stdout).unwrap_or_else(|e| panic!("{stdout:?}: {e}"));
    let version = e["cniVersion"].as_str().unwrap_or_default();
    assert!(SUPPORTED_VERSIONS.contains(&version), "{stdout}");
    assert!(e["code"].as_u64().is_some(), "{stdout}");
    assert!(e["msg"].as_str().is_some_and(|m| !m.is_empty()), "{stdout}");
}

fuzz_target!(|stdin: &[u8]| {
    let parsed = NetConf::parse(stdin);
    if let Ok(conf) = &parsed {
        assert!(SUPPORTED_VERSIONS.contains(&conf.cni_version.as_str()));
        let _ = conf.prev_ips();
    }
    let _ = NetConf::version_of(stdin);

    let add = quiet_stderr(|| run(&env("ADD"), stdin));
    match (&parsed, add.status) {
        (Ok(conf), 0) => {
            let mut want = conf.prev_result.clone().unwrap_or(Value::Null);
            if let Some(obj) = want.as_object_mut() {
                obj.entry("cniVersion")
                    .or_insert_with(|| Value::String(conf.cni_version.clone()));
            }
            assert!(
                conf.prev_result.is_some(),
                "ADD without prevResult succeeded"
            );
            assert_eq!(add.stdout, want.to_string(), "prevResult changed");
        }
        (Ok(conf), _) => {
            assert!(
                conf.prev_result.is_none(),
                "ADD with prevResult failed: {}",
                add.stdout
            );
            check_error(&add.stdout);
        }
        (Err(_), 0) => panic!("ADD succeeded on a configuration that does not parse"),
        (Err(_), _) => check_error(&add.stdout),
    }

    let del = quiet_stderr(|| run(&env("DEL"), stdin));
    match parsed {
        Ok(_) => assert_eq!((del.status, del.stdout.as_str()), (0, "")),
        Err(_) => check_error(&del.stdout),
    }

    let version = run(&env("VERSION"), stdin);
    assert_eq!(version.status, 0);
    let v: Value = serde_json::from_str(&version.stdout).unwrap_or_default();
    assert!(v["supportedVersions"].is_array(), "{}", version.stdout);
});
