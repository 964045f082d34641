//! Node credentials of the local backend: a bearer token per node.
//!
//! In a Kubernetes cluster the node proxy authenticates with its ServiceAccount token,
//! checked by TokenReview; on one machine, a file maps node names to tokens:
//!
//! ```yaml
//! nodes:
//!   node-a: 8c1d5e0f7a9b4c3e2d1f0a9b8c7d6e5f
//! ```

use crate::auth::token_digest;
use std::collections::BTreeMap;
use std::path::Path;

/// The shortest token accepted: anything shorter is guessable.
pub const MIN_TOKEN_LEN: usize = 16;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    nodes: BTreeMap<String, String>,
}

/// Node name → SHA-256 of its token. Only digests are kept in memory.
#[derive(Clone, Default)]
pub struct NodeTokens {
    digests: Vec<(String, [u8; 32])>,
}

impl std::fmt::Debug for NodeTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let nodes: Vec<_> = self.digests.iter().map(|(n, _)| n).collect();
        f.debug_struct("NodeTokens").field("nodes", &nodes).finish()
    }
}

impl NodeTokens {
    /// Reads a tokens file; the error names the file and what is wrong.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("node tokens file {}: cannot read: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("node tokens file {}: {e}", path.display()))
    }

    /// Parses the YAML of a tokens file.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file: File = serde_yaml::from_str(text)
            .map_err(|e| format!("{e}; expected `nodes: {{<node-name>: <token>}}`"))?;
        let mut digests = Vec::new();
        for (node, token) in file.nodes {
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "nodes.{node}: token is shorter than {MIN_TOKEN_LEN} characters; use a random one (e.g. `openssl rand -hex 16`)"
                ));
            }
            if let Some((other, _)) = digests.iter().find(|(_, d)| *d == token_digest(&token)) {
                return Err(format!(
                    "nodes.{node}: same token as node {other}; each node needs its own"
                ));
            }
            digests.push((node, token_digest(&token)));
        }
        Ok(Self { digests })
    }

    /// The node whose token this is. Compares digests in constant time.
    pub fn node_for(&self, token: &str) -> Option<&str> {
        let d = token_digest(token);
        let mut found = None;
        for (node, want) in &self.digests {
            if aws_lc_rs::constant_time::verify_slices_are_equal(&d, want).is_ok() {
                found = Some(node.as_str());
            }
        }
        found
    }
}

impl crate::auth::NodeAuthenticator for NodeTokens {
    fn authenticate<'a>(&'a self, token: &'a str) -> crate::auth::AuthFuture<'a> {
        let node = self.node_for(token).map(str::to_string).ok_or_else(|| {
            crate::auth::Refusal::unauthenticated(
                "unknown_token",
                "node token not recognised; check the node proxy's token against the control plane's node credentials",
            )
        });
        Box::pin(async move { node })
    }
}
