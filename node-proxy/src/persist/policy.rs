//! The inbound policies and outbound routes on disk, as the one protobuf snapshot
//! [`PolicyState::to_snapshot`] makes of them (each policy as the control plane sent it).
//! Read back, it is applied over the start-up default as the control plane's first
//! snapshot would be, until the control plane's own replaces it.

use super::files::{open, seal, Header, Owner};
use super::Rejected;
use crate::policy::{PolicyState, PortPolicy};
use ambit_api::proto::policy as pb;
use prost::Message;

/// What the envelope says it holds.
pub(super) const KIND: &str = "policy";
/// The file, in the state directory.
pub(super) const FILE: &str = "policy.state";

/// `state` as a sealed file for `owner`.
pub(super) fn encode(state: &PolicyState, owner: &Owner) -> Vec<u8> {
    seal(KIND, owner, &state.to_snapshot().encode_to_vec())
}

/// The policy a file holds over `fallback`, or why it is refused. Every policy must
/// parse: the proxy wrote only those it had accepted.
pub(super) fn decode(
    bytes: &[u8],
    owner: &Owner,
    fallback: PortPolicy,
) -> Result<(Header, PolicyState), Rejected> {
    let (header, payload) = open(KIND, owner, bytes)?;
    let update = pb::Update::decode(payload)
        .map_err(|e| Rejected::Corrupt(format!("the snapshot does not decode: {e}")))?;
    if !update.snapshot {
        return Err(Rejected::Corrupt("it holds a delta, not a snapshot".into()));
    }
    let mut state = PolicyState::new(fallback);
    let refused = state.apply(update);
    if let Some(first) = refused.first() {
        return Err(Rejected::Corrupt(format!(
            "{} policies refused, the first: {first}",
            refused.len()
        )));
    }
    Ok((header, state))
}
