//! The CNI commands. Each returns what to print on stdout: the result (ADD), the version
//! document (VERSION), nothing (DEL, CHECK, STATUS, GC), or the spec's error JSON with a
//! non-zero exit.

use crate::client::{ask, ClientError};
use crate::conf::{Env, NetConf, LATEST_VERSION, SUPPORTED_VERSIONS};
use crate::CniError;
use ambit_api::cni::{code, PodAdd, PodRef, Request, Response};
use serde_json::{json, Value};
use std::os::fd::AsFd;
use std::path::Path;

/// What the process prints on stdout and its exit status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// stdout.
    pub stdout: String,
    /// Exit status.
    pub status: i32,
}

/// Runs one invocation: `env` and `stdin` in, [`Outcome`] out. Logs go to stderr.
pub fn run(env: &Env, stdin: &[u8]) -> Outcome {
    match command(env, stdin) {
        Ok(Some(out)) => Outcome {
            stdout: out.to_string(),
            status: 0,
        },
        Ok(None) => Outcome {
            stdout: String::new(),
            status: 0,
        },
        Err(mut e) => {
            if e.cni_version.is_empty() {
                e.cni_version = NetConf::version_of(stdin)
                    .filter(|v| SUPPORTED_VERSIONS.contains(&v.as_str()))
                    .unwrap_or_else(|| LATEST_VERSION.into());
            }
            log(&format!("{} failed: {e}", env.command));
            Outcome {
                stdout: serde_json::to_string(&e).unwrap_or_default(),
                status: 1,
            }
        }
    }
}

fn log(line: &str) {
    crate::log::say(crate::log::Level::Info, "ambit-cni", line);
}

fn command(env: &Env, stdin: &[u8]) -> Result<Option<Value>, CniError> {
    match env.command.as_str() {
        "VERSION" => Ok(Some(version(stdin))),
        "ADD" => add(env, &NetConf::parse(stdin)?),
        "DEL" => del(env, &NetConf::parse(stdin)?),
        "CHECK" => check(env, &NetConf::parse(stdin)?),
        "STATUS" => status(&NetConf::parse(stdin)?),
        "GC" => gc(&NetConf::parse(stdin)?),
        "" => Err(CniError::new(
            code::INVALID_ENV,
            "CNI_COMMAND is not set",
            "ambit-cni is run by the container runtime (or `ambit-cni install` by its DaemonSet)",
        )),
        other => Err(CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {other:?}"),
            "expected ADD, DEL, CHECK, STATUS, GC or VERSION",
        )),
    }
}

fn version(stdin: &[u8]) -> Value {
    json!({
        "cniVersion": NetConf::version_of(stdin).unwrap_or_else(|| LATEST_VERSION.into()),
        "supportedVersions": SUPPORTED_VERSIONS,
    })
}

fn require_1_1(conf: &NetConf, command: &str) -> Result<(), CniError> {
    if conf.cni_version == "1.1.0" {
        Ok(())
    } else {
        Err(CniError::new(
            code::INCOMPATIBLE_VERSION,
            format!("{command} needs cniVersion 1.1.0"),
            format!("the configuration says {}", conf.cni_version),
        ))
    }
}

/// The pod, unless this invocation is not for a Kubernetes pod or its namespace is
/// excluded (then the plugin does nothing).
fn pod_of(env: &Env, conf: &NetConf) -> Option<PodRef> {
    let Some((namespace, name)) = env.pod() else {
        log(&format!("{}: no K8S_POD_NAMESPACE/K8S_POD_NAME in CNI_ARGS; not a Kubernetes pod, nothing to do", env.command));
        return None;
    };
    if conf.exclude_namespaces.contains(&namespace) {
        return None;
    }
    Some(PodRef {
        namespace,
        name,
        container_id: env.container_id.clone(),
    })
}

fn add(env: &Env, conf: &NetConf) -> Result<Option<Value>, CniError> {
    env.require(&["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])?;
    let Some(prev) = conf.prev_result.clone() else {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "ambit-cni is a chained plugin: the configuration has no prevResult",
            "list it after the primary network plugin in a .conflist",
        ));
    };
    // The previous result, unchanged: this plugin adds no interface and no address.
    let mut out = prev;
    if let Some(obj) = out.as_object_mut() {
        obj.entry("cniVersion")
            .or_insert_with(|| Value::String(conf.cni_version.clone()));
    }
    let Some(pod) = pod_of(env, conf) else {
        return Ok(Some(out));
    };
    let key = format!("{}/{}", pod.namespace, pod.name);
    let netns = std::fs::File::open(&env.netns).map_err(|e| {
        CniError::new(
            code::IO_FAILURE,
            format!("cannot open the pod's network namespace {}", env.netns),
            e.to_string(),
        )
    })?;
    let request = Request::Add(PodAdd {
        uid: env.args.get("K8S_POD_UID").cloned().unwrap_or_default(),
        netns_path: env.netns.clone(),
        ips: conf.prev_ips(),
        pod,
    });
    match ask(Path::new(&conf.socket), &request, Some(netns.as_fd()), conf.timeout) {
        Ok(Response::Redirected) => {
            log(&format!("ADD {key}: redirected through the node proxy"));
            Ok(Some(out))
        }
        Ok(Response::NotMeshed | Response::Ok) => Ok(Some(out)),
        Ok(Response::Error { code, msg, details }) => Err(CniError::new(code, msg, details)),
        Err(e) => Err(CniError::new(code::PROXY_UNREACHABLE, format!("cannot hand pod {key} to the node proxy"), format!("{e}; the pod is not started unprotected: check the ambit-proxy DaemonSet on this node"))),
    }
}

fn del(env: &Env, conf: &NetConf) -> Result<Option<Value>, CniError> {
    env.require(&["CNI_CONTAINERID", "CNI_IFNAME"])?;
    let Some(pod) = pod_of(env, conf) else {
        return Ok(None);
    };
    let key = format!("{}/{}", pod.namespace, pod.name);
    match ask(
        Path::new(&conf.socket),
        &Request::Del(pod),
        None,
        conf.timeout,
    ) {
        Ok(Response::Error { code, msg, details }) => Err(CniError::new(code, msg, details)),
        Ok(_) => Ok(None),
        // DEL must not wedge a pod's deletion: a proxy that is away forgets the pod on
        // its own (its namespace is gone, or GC drops it).
        Err(e @ (ClientError::Unreachable { .. } | ClientError::NoAnswer { .. })) => {
            log(&format!(
                "DEL {key}: {e}; the proxy cleans up when it is back"
            ));
            Ok(None)
        }
    }
}

fn check(env: &Env, conf: &NetConf) -> Result<Option<Value>, CniError> {
    env.require(&["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"])?;
    if conf.prev_result.is_none() {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "CHECK needs prevResult",
            "the runtime passes the cached result of ADD",
        ));
    }
    let Some(pod) = pod_of(env, conf) else {
        return Ok(None);
    };
    match ask(
        Path::new(&conf.socket),
        &Request::Check(pod),
        None,
        conf.timeout,
    ) {
        Ok(Response::Error { code, msg, details }) => Err(CniError::new(code, msg, details)),
        Ok(_) => Ok(None),
        Err(e) => Err(CniError::new(
            code::PROXY_UNREACHABLE,
            "cannot check the pod with the node proxy",
            e.to_string(),
        )),
    }
}

fn status(conf: &NetConf) -> Result<Option<Value>, CniError> {
    require_1_1(conf, "STATUS")?;
    match ask(
        Path::new(&conf.socket),
        &Request::Status,
        None,
        conf.timeout,
    ) {
        Ok(Response::Error { msg, details, .. }) => {
            Err(CniError::new(code::NOT_AVAILABLE, msg, details))
        }
        Ok(_) => Ok(None),
        Err(e) => Err(CniError::new(
            code::NOT_AVAILABLE,
            "the node proxy is not available",
            format!("{e}; meshed pods cannot be started until it is"),
        )),
    }
}

fn gc(conf: &NetConf) -> Result<Option<Value>, CniError> {
    require_1_1(conf, "GC")?;
    // Absent is not "no attachment is valid": read that way it would drop every pod on
    // the node, and a dropped pod is no longer redirected.
    let Some(valid) = conf.valid_attachments.clone() else {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "GC without \"cni.dev/valid-attachments\"",
            "the runtime must list the attachments still valid; nothing was removed",
        ));
    };
    let request = Request::Gc {
        valid_container_ids: valid,
    };
    match ask(Path::new(&conf.socket), &request, None, conf.timeout) {
        Ok(Response::Error { code, msg, details }) => Err(CniError::new(code, msg, details)),
        Ok(_) => Ok(None),
        Err(e) => Err(CniError::new(
            code::TRY_AGAIN,
            "cannot reach the node proxy for GC",
            e.to_string(),
        )),
    }
}
