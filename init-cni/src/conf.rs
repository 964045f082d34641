//! What the runtime gives the plugin: the network configuration on stdin and the
//! `CNI_*` environment variables.

use crate::CniError;
use ambit_api::cni::code;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// The CNI spec versions this plugin speaks.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.4.0", "1.0.0", "1.1.0"];
/// The newest of them.
pub const LATEST_VERSION: &str = "1.1.0";
/// Namespaces whose pods are never handed over (the cluster's own and the mesh's).
pub const DEFAULT_EXCLUDED_NAMESPACES: &[&str] = &["kube-system", "ambit"];
/// How long the plugin waits for the proxy's answer by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(35);

/// The plugin's entry in the network configuration list.
#[derive(Debug, Clone)]
pub struct NetConf {
    /// `cniVersion`.
    pub cni_version: String,
    /// `name` of the network.
    pub name: String,
    /// The previous plugin's result, passed through unchanged.
    pub prev_result: Option<Value>,
    /// The node proxy's socket (`socket`).
    pub socket: String,
    /// How long to wait for the proxy (`timeout`, e.g. `"30s"`).
    pub timeout: Duration,
    /// Namespaces left alone (`exclude_namespaces`).
    pub exclude_namespaces: Vec<String>,
    /// GC: the sandboxes of the attachments still valid (`cni.dev/valid-attachments`);
    /// `None` when the field is absent (which is not "none are valid").
    pub valid_attachments: Option<Vec<String>>,
}

fn field<'a>(obj: &'a serde_json::Map<String, Value>, name: &str) -> Option<&'a Value> {
    obj.get(name).filter(|v| !v.is_null())
}

impl NetConf {
    /// Parses stdin. Malformed JSON is code 6; a missing or wrong field is code 7; an
    /// unsupported version is code 1 (each naming the field).
    pub fn parse(stdin: &[u8]) -> Result<Self, CniError> {
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                code::DECODE,
                "the network configuration on stdin is not JSON",
                e.to_string(),
            )
        })?;
        let Value::Object(obj) = value else {
            return Err(CniError::new(
                code::DECODE,
                "the network configuration on stdin is not a JSON object",
                "",
            ));
        };
        let string = |name: &str| -> Result<Option<String>, CniError> {
            match field(&obj, name) {
                None => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(CniError::new(
                    code::INVALID_CONFIG,
                    format!("network configuration field {name:?} must be a string"),
                    format!("found {other}"),
                )),
            }
        };
        let cni_version = string("cniVersion")?.ok_or_else(|| {
            CniError::new(
                code::INVALID_CONFIG,
                "network configuration has no \"cniVersion\"",
                "set it to one of 0.4.0, 1.0.0, 1.1.0",
            )
        })?;
        if !SUPPORTED_VERSIONS.contains(&cni_version.as_str()) {
            return Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("CNI version {cni_version} is not supported"),
                format!("ambit-cni supports {}", SUPPORTED_VERSIONS.join(", ")),
            )
            .with_version(LATEST_VERSION));
        }
        let name = string("name")?.unwrap_or_default();
        let socket = string("socket")?.unwrap_or_else(|| ambit_api::cni::DEFAULT_SOCKET.into());
        let timeout = match string("timeout")? {
            None => DEFAULT_TIMEOUT,
            Some(t) => ambit_api::duration::parse_duration(&t).map_err(|e| {
                CniError::new(
                    code::INVALID_CONFIG,
                    format!("network configuration field \"timeout\": {t:?} is not a duration"),
                    e.to_string(),
                )
            })?,
        };
        let exclude_namespaces = match field(&obj, "exclude_namespaces") {
            None => DEFAULT_EXCLUDED_NAMESPACES.iter().map(|s| s.to_string()).collect(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| CniError::new(code::INVALID_CONFIG, "network configuration field \"exclude_namespaces\" must be a list of strings", ""))?,
            Some(_) => return Err(CniError::new(code::INVALID_CONFIG, "network configuration field \"exclude_namespaces\" must be a list of strings", "")),
        };
        let valid_attachments = match field(&obj, "cni.dev/valid-attachments") {
            None | Some(Value::Null) => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|a| {
                        a.get("containerID")
                            .and_then(Value::as_str)
                            .filter(|id| !id.is_empty())
                            .map(str::to_string)
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| {
                        CniError::new(
                            code::INVALID_CONFIG,
                            "\"cni.dev/valid-attachments\" has an entry without a containerID",
                            "every valid attachment must name its sandbox; nothing was removed",
                        )
                    })?,
            ),
            Some(_) => {
                return Err(CniError::new(
                    code::INVALID_CONFIG,
                    "\"cni.dev/valid-attachments\" must be a list",
                    "",
                ))
            }
        };
        Ok(Self {
            cni_version,
            name,
            prev_result: field(&obj, "prevResult").cloned(),
            socket,
            timeout,
            exclude_namespaces,
            valid_attachments,
        })
    }

    /// The version only, for error messages about a configuration that did not parse.
    pub fn version_of(stdin: &[u8]) -> Option<String> {
        let v: Value = serde_json::from_slice(stdin).ok()?;
        v.get("cniVersion")?.as_str().map(str::to_string)
    }

    /// The pod's addresses from `prevResult.ips[].address` (CIDR notation).
    pub fn prev_ips(&self) -> Vec<std::net::IpAddr> {
        let Some(ips) = self
            .prev_result
            .as_ref()
            .and_then(|r| r.get("ips"))
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        ips.iter()
            .filter_map(|ip| ip.get("address").and_then(Value::as_str))
            .filter_map(|cidr| cidr.split('/').next()?.parse().ok())
            .collect()
    }
}

/// The `CNI_*` environment.
#[derive(Debug, Clone, Default)]
pub struct Env {
    /// `CNI_COMMAND`.
    pub command: String,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// `CNI_NETNS`.
    pub netns: String,
    /// `CNI_IFNAME`.
    pub ifname: String,
    /// `CNI_ARGS`, split into pairs.
    pub args: BTreeMap<String, String>,
}

impl Env {
    /// Reads the process environment.
    pub fn from_process() -> Self {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// Reads the environment through `get` (tests pass their own).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Self {
        let args = get("CNI_ARGS")
            .unwrap_or_default()
            .split(';')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        Self {
            command: get("CNI_COMMAND").unwrap_or_default(),
            container_id: get("CNI_CONTAINERID").unwrap_or_default(),
            netns: get("CNI_NETNS").unwrap_or_default(),
            ifname: get("CNI_IFNAME").unwrap_or_default(),
            args,
        }
    }

    /// Fails with code 4 naming every variable of `names` that is unset or empty.
    pub fn require(&self, names: &[&str]) -> Result<(), CniError> {
        let missing: Vec<&str> = names
            .iter()
            .copied()
            .filter(|n| match *n {
                "CNI_CONTAINERID" => self.container_id.is_empty(),
                "CNI_NETNS" => self.netns.is_empty(),
                "CNI_IFNAME" => self.ifname.is_empty(),
                _ => false,
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(CniError::new(
                code::INVALID_ENV,
                format!(
                    "missing environment variable{}: {}",
                    if missing.len() > 1 { "s" } else { "" },
                    missing.join(", ")
                ),
                format!(
                    "CNI_COMMAND={} needs them; ambit-cni is run by the container runtime",
                    self.command
                ),
            ))
        }
    }

    /// `K8S_POD_NAMESPACE` and `K8S_POD_NAME`, when this is a Kubernetes pod.
    pub fn pod(&self) -> Option<(String, String)> {
        let ns = self
            .args
            .get("K8S_POD_NAMESPACE")
            .filter(|s| !s.is_empty())?;
        let name = self.args.get("K8S_POD_NAME").filter(|s| !s.is_empty())?;
        Some((ns.clone(), name.clone()))
    }
}
