//! The discovery state on disk: the node's last view of the cluster, as the one protobuf
//! snapshot [`DiscoveryState::to_snapshot`] makes of it. Read back, it is applied to an
//! empty state as the control plane's first snapshot would be: the proxy serves its pods
//! from it until the control plane's own snapshot replaces it.

use super::files::{open, seal, Header, Owner};
use super::Rejected;
use crate::discovery::DiscoveryState;
use ambit_api::proto::discovery as pb;
use prost::Message;

/// What the envelope says it holds.
pub(super) const KIND: &str = "discovery";
/// The file, in the state directory.
pub(super) const FILE: &str = "discovery.state";

/// `state` as a sealed file for `owner`.
pub(super) fn encode(state: &DiscoveryState, owner: &Owner) -> Vec<u8> {
    seal(KIND, owner, &state.to_snapshot().encode_to_vec())
}

/// The state a file holds, or why it is refused. Every resource must be valid: the proxy
/// wrote only valid ones, so one that is not means the file is not what it wrote.
pub(super) fn decode(bytes: &[u8], owner: &Owner) -> Result<(Header, DiscoveryState), Rejected> {
    let (header, payload) = open(KIND, owner, bytes)?;
    let update = pb::Update::decode(payload)
        .map_err(|e| Rejected::Corrupt(format!("the snapshot does not decode: {e}")))?;
    if !update.snapshot {
        return Err(Rejected::Corrupt("it holds a delta, not a snapshot".into()));
    }
    let mut state = DiscoveryState::default();
    let invalid = state.apply(update);
    if let Some(first) = invalid.first() {
        return Err(Rejected::Corrupt(format!(
            "{} invalid resources, the first: {first}",
            invalid.len()
        )));
    }
    Ok((header, state))
}
