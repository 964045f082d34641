//! What `ambit check` found, and how it is shown: `linkerd check`'s shape — √ / ‼ / ×
//! lines grouped by section, each failure or warning with a hint — or JSON.

use serde::Serialize;

/// The outcome of one check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// √
    Success,
    /// ‼ (exit 0 unless `--strict`)
    Warning,
    /// ×
    Error,
}

impl Status {
    fn mark(self) -> &'static str {
        match self {
            Status::Success => "√",
            Status::Warning => "‼",
            Status::Error => "×",
        }
    }
}

/// One check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// What was checked, as a statement that holds when it succeeds.
    pub description: String,
    /// The outcome.
    pub result: Status,
    /// What was found, when it is not a success.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What to do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    /// A success.
    pub fn ok(description: impl Into<String>) -> Self {
        Self {
            description: description.into(),
            result: Status::Success,
            error: None,
            hint: None,
        }
    }

    /// A warning: what was found and what to do.
    pub fn warn(
        description: impl Into<String>,
        error: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Self {
            description: description.into(),
            result: Status::Warning,
            error: Some(error.into()),
            hint: Some(hint.into()),
        }
    }

    /// A failure: what was found and what to do.
    pub fn fail(
        description: impl Into<String>,
        error: impl Into<String>,
        hint: impl Into<String>,
    ) -> Self {
        Self {
            description: description.into(),
            result: Status::Error,
            error: Some(error.into()),
            hint: Some(hint.into()),
        }
    }
}

/// A section of checks.
#[derive(Clone, Debug, Serialize)]
pub struct Category {
    /// Its name, e.g. `ambit-node`.
    #[serde(rename = "categoryName")]
    pub name: String,
    /// Its checks, in order.
    pub checks: Vec<Check>,
}

/// Everything `ambit check` found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// Whether nothing failed (and, with `--strict`, nothing warned).
    pub success: bool,
    /// The sections.
    pub categories: Vec<Category>,
}

impl Report {
    /// Adds a section.
    pub fn add(&mut self, name: &str, checks: Vec<Check>) {
        self.categories.push(Category {
            name: name.into(),
            checks,
        });
    }

    /// Sets `success`, and returns the exit status: non-zero on any ×, and with `strict`
    /// on any ‼ as well (an expiring certificate is an outage waiting to happen).
    pub fn finish(&mut self, strict: bool) -> i32 {
        let worst = self
            .categories
            .iter()
            .flat_map(|c| &c.checks)
            .map(|c| c.result)
            .fold(Status::Success, |w, s| match (w, s) {
                (Status::Error, _) | (_, Status::Error) => Status::Error,
                (Status::Warning, _) | (_, Status::Warning) => Status::Warning,
                _ => Status::Success,
            });
        self.success = match worst {
            Status::Success => true,
            Status::Warning => !strict,
            Status::Error => false,
        };
        i32::from(!self.success)
    }

    /// `linkerd check`'s text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.categories {
            out.push_str(&format!(
                "{}\n{}\n",
                c.name,
                "-".repeat(c.name.chars().count())
            ));
            for check in &c.checks {
                out.push_str(&format!("{} {}\n", check.result.mark(), check.description));
                if let Some(e) = &check.error {
                    out.push_str(&format!("    {e}\n"));
                }
                if let Some(h) = &check.hint {
                    out.push_str(&format!("    hint: {h}\n"));
                }
            }
            out.push('\n');
        }
        let mark = if self.success { "√" } else { "×" };
        out.push_str(&format!("Status check results are {mark}\n"));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(statuses: &[Status]) -> Report {
        let mut r = Report::default();
        r.add(
            "ambit-test",
            statuses
                .iter()
                .map(|s| match s {
                    Status::Success => Check::ok("fine"),
                    Status::Warning => Check::warn("soon", "expires in 30 days", "rotate"),
                    Status::Error => Check::fail("broken", "expired", "rotate now"),
                })
                .collect(),
        );
        r
    }

    #[test]
    fn a_warning_fails_only_with_strict_and_an_error_always() {
        use Status::*;
        assert_eq!(report(&[Success, Success]).finish(false), 0);
        assert_eq!(report(&[Success, Warning]).finish(false), 0);
        assert_eq!(report(&[Success, Warning]).finish(true), 1);
        assert_eq!(report(&[Warning, Error]).finish(false), 1);
    }

    #[test]
    fn text_groups_by_section_with_marks_and_hints() {
        use Status::*;
        let mut r = report(&[Success, Warning, Error]);
        r.finish(false);
        assert_eq!(
            r.text(),
            "ambit-test\n----------\n√ fine\n‼ soon\n    expires in 30 days\n    hint: rotate\n\
             × broken\n    expired\n    hint: rotate now\n\nStatus check results are ×\n"
        );
        let json = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(json["success"], false);
        assert_eq!(json["categories"][0]["checks"][1]["result"], "warning");
        assert_eq!(json["categories"][0]["checks"][0].get("hint"), None);
    }
}
