//! Lists as the API server serves them: a consistent snapshot at one resourceVersion,
//! in etcd's key order, cut in pages by `limit` with a `continue` token that carries the
//! snapshot's version and where the next page starts (410 once that version is
//! compacted away).

use super::select::Filter;
use super::status::Failure;
use super::store::Store;
use k8s_openapi::ByteString;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The `XList` for a list request's query parameters.
pub(crate) fn list(
    store: &Store,
    kind: usize,
    namespace: Option<String>,
    query: &HashMap<String, String>,
) -> Result<Value, Failure> {
    let q = |k: &str| query.get(k).map(String::as_str);
    let ty = store.ty(kind).clone();
    let filter = Filter::parse(&ty, namespace, q("labelSelector"), q("fieldSelector"))?;
    let limit = match q("limit") {
        Some(l) => l
            .parse::<usize>()
            .map_err(|_| Failure::bad_request(format!("invalid limit: {l}")))?,
        None => 0,
    };
    let (rv, start) = match q("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            if q("resourceVersion").is_some_and(|rv| !rv.is_empty()) {
                return Err(Failure::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            decode_continue(token)?
        }
        None => (
            snapshot_version(store, q("resourceVersion"), q("resourceVersionMatch"))?,
            String::new(),
        ),
    };
    let objects = store.objects_at(kind, rv).map_err(|f| {
        if f.code == 410 && !start.is_empty() {
            Failure::continue_expired()
        } else {
            f
        }
    })?;
    let selected: Vec<(&String, &Value)> = objects
        .range(start..)
        .filter(|(_, o)| filter.matches(o))
        .collect();
    let page = if limit == 0 {
        &selected[..]
    } else {
        &selected[..limit.min(selected.len())]
    };
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    let remaining = selected.len() - page.len();
    if let (true, Some((last, _))) = (remaining > 0, page.last()) {
        metadata["continue"] = json!(encode_continue(rv, &format!("{last}\u{0}")));
        if !filter.selects() {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    let items: Vec<Value> = page
        .iter()
        .map(|(_, o)| {
            let mut item = (*o).clone();
            if ty.builtin {
                // Typed lists carry the kind once, on the list.
                if let Some(item) = item.as_object_mut() {
                    item.remove("apiVersion");
                    item.remove("kind");
                }
            }
            item
        })
        .collect();
    Ok(json!({
        "kind": format!("{}List", ty.kind),
        "apiVersion": ty.api_version(),
        "metadata": metadata,
        "items": items,
    }))
}

/// The version a first page is served at: the newest, unless `Exact` asks for an
/// older one.
fn snapshot_version(
    store: &Store,
    rv: Option<&str>,
    version_match: Option<&str>,
) -> Result<u64, Failure> {
    let parse = |rv: &str| {
        rv.parse::<u64>()
            .map_err(|_| Failure::bad_request(format!("invalid resource version: {rv}")))
    };
    match (
        rv.filter(|rv| !rv.is_empty()),
        version_match.filter(|m| !m.is_empty()),
    ) {
        (None, None) => Ok(store.rv()),
        (None, Some(_)) => Err(Failure::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        )),
        (Some("0"), Some("Exact")) => Err(Failure::bad_request(
            "resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"",
        )),
        (Some("0"), _) => Ok(store.rv()),
        (Some(rv), Some("Exact")) => parse(rv),
        (Some(rv), None | Some("NotOlderThan")) => {
            let rv = parse(rv)?;
            if rv > store.rv() {
                return Err(Failure::too_large(rv, store.rv()));
            }
            Ok(store.rv())
        }
        (Some(_), Some(m)) => Err(Failure::bad_request(format!(
            "unsupported resourceVersionMatch: {m}"
        ))),
    }
}

/// The API server's token: base64 of `{"v": "meta.k8s.io/v1", "rv": ..., "start": ...}`.
fn encode_continue(rv: u64, start: &str) -> String {
    let json = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": start}).to_string();
    match serde_json::to_value(ByteString(json.into_bytes())) {
        Ok(Value::String(s)) => s,
        _ => String::new(),
    }
}

fn decode_continue(token: &str) -> Result<(u64, String), Failure> {
    let bad = || Failure::bad_request(format!("continue key is not valid: {token:?}"));
    let bytes: ByteString =
        serde_json::from_value(Value::String(token.to_string())).map_err(|_| bad())?;
    let value: Value = serde_json::from_slice(&bytes.0).map_err(|_| bad())?;
    match (
        value["v"].as_str(),
        value["rv"].as_u64(),
        value["start"].as_str(),
    ) {
        (Some("meta.k8s.io/v1"), Some(rv), Some(start)) => Ok((rv, start.to_string())),
        _ => Err(bad()),
    }
}
