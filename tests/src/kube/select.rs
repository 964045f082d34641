//! Which objects a request asks for: its namespace, `labelSelector` and `fieldSelector`,
//! with the API server's grammar (equality, inequality, `in`, `notin`, existence).

use super::resource::ResourceType;
use super::status::Failure;
use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone)]
enum Label {
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A request's selection of objects of one kind.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    namespace: Option<String>,
    labels: Vec<Label>,
    /// (field path, value, whether equal is wanted).
    fields: Vec<(String, String, bool)>,
}

impl Filter {
    /// Parses the selectors as the API server does; an unknown field is a 400.
    pub(crate) fn parse(
        ty: &ResourceType,
        namespace: Option<String>,
        labels: Option<&str>,
        fields: Option<&str>,
    ) -> Result<Self, Failure> {
        let mut filter = Self {
            namespace,
            ..Self::default()
        };
        for req in split(labels.unwrap_or_default()) {
            filter.labels.push(parse_label(&req)?);
        }
        for req in split(fields.unwrap_or_default()) {
            let (field, value, equal) = if let Some((f, v)) = req.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = req.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = req.split_once('=') {
                (f, v, true)
            } else {
                return Err(Failure::bad_request(format!(
                    "invalid field selector: {req:?}: no operator"
                )));
            };
            let field = field.trim();
            let known = ["metadata.name", "metadata.namespace"].contains(&field)
                || ty.fields.iter().any(|f| f == field);
            if !known {
                return Err(Failure::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            filter
                .fields
                .push((field.to_string(), value.trim().to_string(), equal));
        }
        Ok(filter)
    }

    /// Whether a label or field selector narrows the list (the API server then leaves
    /// `remainingItemCount` out).
    pub(crate) fn selects(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }

    /// Whether `object` is selected.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        if let Some(ns) = &self.namespace {
            if meta["namespace"].as_str() != Some(ns) {
                return false;
            }
        }
        let label = |k: &str| meta["labels"][k].as_str();
        let labels_ok = self.labels.iter().all(|req| match req {
            Label::Exists(k) => label(k).is_some(),
            Label::NotExists(k) => label(k).is_none(),
            Label::In(k, vs) => label(k).is_some_and(|v| vs.iter().any(|w| w == v)),
            Label::NotIn(k, vs) => !label(k).is_some_and(|v| vs.iter().any(|w| w == v)),
        });
        labels_ok
            && self
                .fields
                .iter()
                .all(|(path, value, equal)| (field(object, path) == *value) == *equal)
    }
}

/// Splits on commas outside parentheses; drops empty requirements.
fn split(selector: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in selector.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    out.push(current);
    out.into_iter()
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty())
        .collect()
}

fn parse_label(req: &str) -> Result<Label, Failure> {
    let bad = || Failure::bad_request(format!("unable to parse requirement: {req:?}"));
    if let Some(key) = req.strip_prefix('!') {
        return Ok(Label::NotExists(key.trim().to_string()));
    }
    for (op, negate) in [(" notin ", true), (" in ", false)] {
        if let Some((key, set)) = req.split_once(op) {
            let set = set.trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(bad)?;
            let values = inner.split(',').map(|v| v.trim().to_string()).collect();
            let key = key.trim().to_string();
            return Ok(if negate {
                Label::NotIn(key, values)
            } else {
                Label::In(key, values)
            });
        }
    }
    let one = |k: &str, v: &str| (k.trim().to_string(), vec![v.trim().to_string()]);
    if let Some((k, v)) = req.split_once("!=") {
        let (k, v) = one(k, v);
        return Ok(Label::NotIn(k, v));
    }
    if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
        let (k, v) = one(k, v);
        return Ok(Label::In(k, v));
    }
    if req.contains(['<', '>', ' ', '(', ')']) {
        return Err(bad());
    }
    Ok(Label::Exists(req.to_string()))
}

/// The value of a field path as a field selector compares it (absent is empty).
fn field(object: &Value, path: &str) -> String {
    let value = path.split('.').fold(object, |v, segment| &v[segment]);
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}
