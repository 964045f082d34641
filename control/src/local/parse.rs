//! Parsing Kubernetes objects from YAML, with errors that name the file, the document,
//! the object and the field — and that catch misspelt field names, which the Kubernetes
//! types would otherwise ignore silently.

use crate::index::{Kind, KubeObject};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value as Json;
use std::fmt;
use std::path::{Path, PathBuf};

/// An object read from a file.
#[derive(Clone, Debug)]
pub struct LoadedObject {
    /// The file it came from.
    pub file: PathBuf,
    /// Its document number in the file, from 1.
    pub document: usize,
    /// The object.
    pub object: KubeObject,
}

/// What is wrong in the local directory: where, which object, which field, and what.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct LocalError {
    /// The file (or directory).
    pub file: PathBuf,
    /// The YAML document, from 1.
    pub document: Option<usize>,
    /// The object, e.g. `Pod default/web-0`, as far as it is known.
    pub object: Option<String>,
    /// The field path, e.g. `spec.nodeName`.
    pub field: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for LocalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(d) = self.document {
            write!(f, " (document {d})")?;
        }
        if let Some(o) = &self.object {
            write!(f, ": {o}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Parses every object of a (multi-document) YAML file. Kinds the mesh does not read
/// (Deployments, ConfigMaps, ...) are skipped; `skipped` counts them.
pub fn parse_file(
    file: &Path,
    text: &str,
    skipped: &mut usize,
) -> Result<Vec<LoadedObject>, LocalError> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document = i + 1;
        let at = |object: Option<String>, field: Option<String>, message: String| LocalError {
            file: file.to_path_buf(),
            document: Some(document),
            object,
            field,
            message,
        };
        let value = serde_yaml::Value::deserialize_from(doc)
            .map_err(|e| at(None, None, format!("not valid YAML: {e}")))?;
        if value.is_null() {
            continue; // an empty document, e.g. after a trailing `---`
        }
        let json = serde_json::to_value(&value)
            .map_err(|e| at(None, None, format!("not a Kubernetes object: {e}")))?;
        let before = out.len();
        parse_value(json, &mut out, skipped, &|o, f, m| at(o, f, m))?;
        // Only what this document added (a loop over every object so far made a file of
        // n documents cost n², minutes for 100,000 pods in one file).
        for o in &mut out[before..] {
            o.file = file.to_path_buf();
            if o.document == 0 {
                o.document = document;
            }
        }
    }
    Ok(out)
}

type At<'a> = dyn Fn(Option<String>, Option<String>, String) -> LocalError + 'a;

fn parse_value(
    json: Json,
    out: &mut Vec<LoadedObject>,
    skipped: &mut usize,
    at: &At<'_>,
) -> Result<(), LocalError> {
    let Json::Object(map) = &json else {
        return Err(at(
            None,
            None,
            "expected a mapping with apiVersion and kind".into(),
        ));
    };
    let field = |name: &str| -> Result<String, LocalError> {
        match map.get(name) {
            Some(Json::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(at(None, Some(name.into()), "required (a string)".into())),
        }
    };
    let (api_version, kind) = (field("apiVersion")?, field("kind")?);
    let name = map
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(Json::as_str)
        .unwrap_or("<unnamed>");
    let object = Some(format!("{kind} {name}"));

    if kind == "List" {
        let Some(Json::Array(items)) = map.get("items") else {
            return Err(at(object, Some("items".into()), "required (a list)".into()));
        };
        for item in items.clone() {
            parse_value(item, out, skipped, at)?;
        }
        return Ok(());
    }
    let known = match Kind::from_name(&kind) {
        None => {
            tracing::debug!(%kind, %name, "skipping a kind the mesh does not read");
            *skipped += 1;
            return Ok(());
        }
        // Another project's kind of the same name (a policy kind's name is not unique
        // the way core kinds' are); but a Linkerd manifest is almost surely meant for us.
        Some(k) if k.is_policy() && !is_policy_group(&api_version) => {
            tracing::debug!(%kind, %name, %api_version, "skipping a kind of another API group");
            *skipped += 1;
            return Ok(());
        }
        Some(k) if k.is_gateway() && !is_gateway_group(&api_version) => {
            tracing::debug!(%kind, %name, %api_version, "skipping a kind of another API group");
            *skipped += 1;
            return Ok(());
        }
        Some(k) if k.api_version() != api_version => {
            let want = k.api_version();
            return Err(at(
                object,
                Some("apiVersion".into()),
                format!("{api_version:?} is not the apiVersion of {kind}; use {want:?}"),
            ));
        }
        Some(k) => k,
    };
    let parsed = match known {
        Kind::Namespace => typed(json, at, object.clone()).map(KubeObject::Namespace),
        Kind::Pod => typed(json, at, object.clone()).map(KubeObject::Pod),
        Kind::ServiceAccount => typed(json, at, object.clone()).map(KubeObject::ServiceAccount),
        Kind::Service => typed(json, at, object.clone()).map(KubeObject::Service),
        Kind::EndpointSlice => typed(json, at, object.clone()).map(KubeObject::EndpointSlice),
        Kind::Server => typed(json, at, object.clone()).map(KubeObject::Server),
        Kind::AuthorizationPolicy => {
            typed(json, at, object.clone()).map(KubeObject::AuthorizationPolicy)
        }
        Kind::MeshTlsAuthentication => {
            typed(json, at, object.clone()).map(KubeObject::MeshTlsAuthentication)
        }
        Kind::NetworkAuthentication => {
            typed(json, at, object.clone()).map(KubeObject::NetworkAuthentication)
        }
        Kind::HttpRoute => typed(json, at, object.clone()).map(KubeObject::HttpRoute),
        Kind::GrpcRoute => typed(json, at, object.clone()).map(KubeObject::GrpcRoute),
    }?;
    out.push(LoadedObject {
        file: PathBuf::new(),
        document: 0,
        object: parsed,
    });
    Ok(())
}

/// Whether `api_version` is of `policy.ambit.dev`, or of Linkerd's `policy.linkerd.io`
/// (refused with the apiVersion to use rather than skipped: a policy that silently does
/// not apply is worse than an error).
fn is_policy_group(api_version: &str) -> bool {
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    group == crate::index::crd::POLICY_GROUP || group == "policy.linkerd.io"
}

/// Whether `api_version` is of Gateway API (any version: `v1beta1` is refused with the
/// one to use) or of Linkerd's `policy.linkerd.io`, whose HTTPRoutes (`v1beta3`) are
/// refused the same way rather than skipped.
fn is_gateway_group(api_version: &str) -> bool {
    let group = api_version.split_once('/').map_or("", |(g, _)| g);
    group == crate::index::gateway::GATEWAY_GROUP || group == "policy.linkerd.io"
}

/// Deserializes `json` as `T`, naming the failing field, then rejects fields `T` does not
/// have (a round trip through `T` drops them).
fn typed<T: DeserializeOwned + Serialize>(
    json: Json,
    at: &At<'_>,
    object: Option<String>,
) -> Result<T, LocalError> {
    let value: T = serde_path_to_error::deserialize(json.clone()).map_err(|e| {
        let path = e.path().to_string();
        at(object.clone(), Some(path), e.inner().to_string())
    })?;
    let round_trip = serde_json::to_value(&value)
        .map_err(|e| at(object.clone(), None, format!("internal: {e}")))?;
    if let Some(path) = unknown_field(&json, &round_trip, String::new()) {
        return Err(at(
            object,
            Some(path),
            "unknown field; check its spelling against the Kubernetes API reference".into(),
        ));
    }
    Ok(value)
}

/// The first path present (and not null) in `original` but absent from `known`.
fn unknown_field(original: &Json, known: &Json, path: String) -> Option<String> {
    match (original, known) {
        (Json::Object(o), Json::Object(k)) => o.iter().find_map(|(key, v)| {
            let p = if path.is_empty() {
                key.clone()
            } else {
                format!("{path}.{key}")
            };
            match k.get(key) {
                None if !v.is_null() => Some(p),
                None => None,
                Some(kv) => unknown_field(v, kv, p),
            }
        }),
        (Json::Array(o), Json::Array(k)) => o
            .iter()
            .zip(k)
            .enumerate()
            .find_map(|(i, (ov, kv))| unknown_field(ov, kv, format!("{path}[{i}]"))),
        _ => None,
    }
}

trait DeserializeFrom: Sized {
    fn deserialize_from(d: serde_yaml::Deserializer<'_>) -> Result<Self, serde_yaml::Error>;
}

impl DeserializeFrom for serde_yaml::Value {
    fn deserialize_from(d: serde_yaml::Deserializer<'_>) -> Result<Self, serde_yaml::Error> {
        serde::Deserialize::deserialize(d)
    }
}
