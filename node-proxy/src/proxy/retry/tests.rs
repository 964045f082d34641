use super::*;
use crate::proxy::body::{Body, BoxError};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use std::time::Duration;

fn retry(statuses: &[(u16, u16)], grpc: &[u8]) -> Retry {
    Retry {
        limit: 2,
        http_statuses: statuses.to_vec(),
        grpc_codes: grpc.to_vec(),
        backoff: Duration::from_millis(25),
    }
}

#[test]
fn statuses_in_a_range_and_listed_grpc_codes_are_retried() {
    let r = retry(&[(502, 504), (429, 429)], &[14]);
    let none = HeaderMap::new();
    let mut unavailable = HeaderMap::new();
    unavailable.insert("grpc-status", "14".parse().unwrap());
    let mut internal = HeaderMap::new();
    internal.insert("grpc-status", "13".parse().unwrap());
    for (status, h, want) in [
        (502, &none, true),
        (504, &none, true),
        (429, &none, true),
        (500, &none, false),
        (200, &none, false),
        (200, &unavailable, true),
        (200, &internal, false),
    ] {
        let s = StatusCode::from_u16(status).unwrap();
        assert_eq!(retryable(&r, s, h), want, "{status} {h:?}");
    }
}

#[test]
fn backoff_doubles_up_to_its_cap_and_jitter_takes_off_at_most_half() {
    let base = Duration::from_millis(25);
    assert_eq!(backoff(base, 1, 0.0), Duration::from_millis(25));
    assert_eq!(backoff(base, 2, 0.0), Duration::from_millis(50));
    assert_eq!(backoff(base, 4, 0.0), Duration::from_millis(200));
    assert_eq!(backoff(base, 5, 0.0), MAX_BACKOFF);
    assert_eq!(backoff(base, 40, 0.0), MAX_BACKOFF);
    assert_eq!(backoff(base, 1, 1.0), Duration::from_micros(12_500));
    assert_eq!(backoff(base, 9, 1.0), MAX_BACKOFF / 2);
}

#[tokio::test(start_paused = true)]
async fn the_budget_allows_a_fifth_of_requests_plus_ten_a_second_over_ten_seconds() {
    let b = Budget::default();
    // No requests: the floor alone, 10 a second over the 10 s window.
    let granted = (0..200).filter(|_| b.withdraw()).count();
    assert_eq!(granted, 100);
    // 1000 requests within the window add 200 retries.
    for _ in 0..1000 {
        b.deposit();
    }
    let granted = (0..500).filter(|_| b.withdraw()).count();
    assert_eq!(granted, 200);
    // Ten seconds later the window has moved on: the floor again.
    tokio::time::advance(Duration::from_secs(10)).await;
    let granted = (0..500).filter(|_| b.withdraw()).count();
    assert_eq!(granted, 100);
    // Slots age out one second at a time: after 5 s, half of the window is new, and the
    // retries taken 5 s ago still count.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(!b.withdraw());
    tokio::time::advance(Duration::from_secs(5)).await;
    assert!(b.withdraw());
}

async fn collect(body: Body) -> (Vec<u8>, Option<HeaderMap>) {
    let c = body.collect().await.unwrap();
    let trailers = c.trailers().cloned();
    (c.to_bytes().to_vec(), trailers)
}

fn streamed(chunks: Vec<&'static [u8]>, trailers: Option<HeaderMap>) -> Body {
    let mut frames: Vec<Result<Frame<Bytes>, BoxError>> = chunks
        .into_iter()
        .map(|c| Ok(Frame::data(Bytes::from_static(c))))
        .collect();
    if let Some(t) = trailers {
        frames.push(Ok(Frame::trailers(t)));
    }
    http_body_util::StreamBody::new(futures::stream::iter(frames)).boxed()
}

#[tokio::test]
async fn a_small_body_is_sent_again_whole_with_its_trailers() {
    let mut t = HeaderMap::new();
    t.insert("x-checksum", "abc".parse().unwrap());
    let (body, replay) = Replay::record(streamed(vec![b"hello ", b"world"], Some(t)));
    // Not yet sent: cannot be replayed.
    assert_eq!(replay.replay().err(), Some(NotReplayable::Streaming));
    let first = collect(body).await;
    assert_eq!(first.0, b"hello world");
    let again = collect(replay.replay().unwrap()).await;
    assert_eq!(again, first);
    // As often as needed.
    assert_eq!(collect(replay.replay().unwrap()).await.0, b"hello world");
}

#[tokio::test]
async fn a_body_over_64_kib_is_not_kept() {
    static BIG: [u8; 40 * 1024] = [7; 40 * 1024];
    let (body, replay) = Replay::record(streamed(vec![&BIG, &BIG], None));
    assert_eq!(collect(body).await.0.len(), 80 * 1024);
    assert_eq!(replay.replay().err(), Some(NotReplayable::TooBig));
    // An empty body is replayable at once.
    let (_, replay) = Replay::record(super::super::body::empty());
    assert_eq!(collect(replay.replay().unwrap()).await.0, b"");
}

#[tokio::test]
async fn a_body_is_whole_once_it_says_it_has_ended_without_a_last_poll() {
    // hyper stops polling a request body once `is_end_stream` is true: the final `None`
    // never comes.
    let full = http_body_util::Full::new(Bytes::from_static(b"hello"))
        .map_err(|e| match e {})
        .boxed();
    let (mut body, replay) = Replay::record(full);
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), "hello");
    assert!(http_body::Body::is_end_stream(&body));
    assert_eq!(collect(replay.replay().unwrap()).await.0, b"hello");
}

#[tokio::test]
async fn a_body_a_try_gave_up_untouched_is_sent_by_the_next_but_not_one_read_part_way() {
    // A try that failed before reading anything (a dead connection): the next sends the
    // whole body.
    let (body, replay) = Replay::record(streamed(vec![b"hello ", b"world"], None));
    drop(body);
    let again = replay.replay().unwrap();
    assert_eq!(collect(again).await.0, b"hello world");
    // And having sent it whole, it can be sent again.
    assert_eq!(collect(replay.replay().unwrap()).await.0, b"hello world");

    // A try that read part of it: not sent whole, so not sent again.
    let (mut body, replay) = Replay::record(streamed(vec![b"one ", b"two ", b"three"], None));
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "one ");
    drop(body);
    assert_eq!(replay.replay().err(), Some(NotReplayable::Streaming));

    // Nor one the first try is still sending (its response came first).
    let (_sending, replay) = Replay::record(streamed(vec![b"x"], None));
    assert_eq!(replay.replay().err(), Some(NotReplayable::Streaming));
}
