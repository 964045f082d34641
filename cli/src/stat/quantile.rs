//! `histogram_quantile` over classic (`le`) buckets, with Prometheus's semantics (its
//! `promql/quantile.go`, `bucketQuantile`): buckets sorted by upper bound, equal bounds
//! merged, float noise and non-monotonic counts evened out, linear interpolation inside the
//! bucket holding the rank, 0 as the lower bound of the first bucket (when its upper bound
//! is above 0), and a quantile that falls in the `+Inf` bucket reported as the highest
//! finite upper bound.

/// The `q`-quantile (0 ≤ q ≤ 1) of cumulative buckets `(upper bound, count)`, in any order.
/// `None` where Prometheus answers NaN: no observations, no `+Inf` bucket, fewer than two
/// buckets.
pub fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || buckets.is_empty() {
        return None;
    }
    let mut b: Vec<(f64, f64)> = buckets.to_vec();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    if b.last().is_none_or(|l| l.0 != f64::INFINITY) {
        return None;
    }
    // Buckets with the same upper bound are one bucket (series that differ only in how
    // they spell `le`).
    let mut merged: Vec<(f64, f64)> = Vec::with_capacity(b.len());
    for (ub, count) in b {
        match merged.last_mut() {
            Some(last) if last.0 == ub => last.1 += count,
            _ => merged.push((ub, count)),
        }
    }
    let mut b = merged;
    // Relative differences within 1e-12 are float noise: a bucket keeps its predecessor's
    // count.
    let mut prev = b[0].1;
    for x in b.iter_mut().skip(1) {
        let delta = (x.1 - prev).abs();
        if delta == 0.0 {
            continue;
        }
        if delta / x.1 <= 1e-12 {
            x.1 = prev;
        } else {
            prev = x.1;
        }
    }
    // Counts never decrease with the bound: take the running maximum.
    let mut max = b[0].1;
    for x in b.iter_mut().skip(1) {
        if x.1 > max {
            max = x.1;
        } else {
            x.1 = max;
        }
    }
    if b.len() < 2 {
        return None;
    }
    let n = b.len();
    let observations = b[n - 1].1;
    if observations == 0.0 {
        return None;
    }
    let mut rank = q * observations;
    // The first bucket (the +Inf one excluded) whose count reaches the rank.
    let i = b[..n - 1].iter().position(|x| x.1 >= rank).unwrap_or(n - 1);
    if i == n - 1 {
        return Some(b[n - 2].0);
    }
    if i == 0 && b[0].0 <= 0.0 {
        return Some(b[0].0);
    }
    let (start, end, mut count) = (if i > 0 { b[i - 1].0 } else { 0.0 }, b[i].0, b[i].1);
    if i > 0 {
        count -= b[i - 1].1;
        rank -= b[i - 1].1;
    }
    let v = start + (end - start) * (rank / count);
    (!v.is_nan()).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    /// Linkerd's latency buckets (node-proxy's `BUCKETS_MS`), then +Inf.
    pub(crate) fn linkerd(counts: &[f64]) -> Vec<(f64, f64)> {
        let bounds = [
            1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 100.0, 200.0, 300.0, 400.0,
            500.0, 1000.0, 2000.0, 3000.0, 4000.0, 5000.0, 10000.0, 20000.0, 30000.0, 40000.0,
            50000.0, INF,
        ];
        bounds.iter().copied().zip(counts.iter().copied()).collect()
    }

    #[test]
    fn interpolates_inside_the_bucket_as_prometheus() {
        // Cumulative: le=1:0, 2:0, 3:0, 4:0, 5:10, 10:60, 20:90, 30:100, … +Inf:100.
        let mut c = vec![0.0, 0.0, 0.0, 0.0, 10.0, 60.0, 90.0];
        c.resize(26, 100.0);
        let b = linkerd(&c);
        // p50: rank 0.5 × 100 = 50; the first bucket reaching 50 is le=10 (60); it holds
        // 60 − 10 = 50 observations between 5 and 10, of which we need 50 − 10 = 40:
        // 5 + (10 − 5) × 40/50 = 9.
        assert_eq!(histogram_quantile(0.5, &b), Some(9.0));
        // p95: rank 95 → le=30 (100): 30 − 20 = 10 wide, 10 observations, 95 − 90 = 5:
        // 20 + 10 × 5/10 = 25.
        assert_eq!(histogram_quantile(0.95, &b), Some(25.0));
        // p99: rank 99 → le=30: 20 + 10 × 9/10 = 29.
        assert_eq!(histogram_quantile(0.99, &b), Some(29.0));
        // p5: rank 5 → le=5 (10): the buckets below are empty, so from 4 to 5:
        // 4 + 1 × (5 − 0)/(10 − 0) = 4.5.
        assert_eq!(histogram_quantile(0.05, &b), Some(4.5));
    }

    #[test]
    fn the_first_bucket_starts_at_zero() {
        // 4 observations ≤ 1 ms, 4 in (1, 2]: p25 = rank 2 in [0, 1] holding 4 → 0.5.
        let b = [(1.0, 4.0), (2.0, 8.0), (INF, 8.0)];
        assert_eq!(histogram_quantile(0.25, &b), Some(0.5));
        // A first bucket at or below 0 is returned as it is.
        let b = [(0.0, 4.0), (2.0, 8.0), (INF, 8.0)];
        assert_eq!(histogram_quantile(0.25, &b), Some(0.0));
    }

    #[test]
    fn the_inf_bucket_answers_the_highest_finite_bound() {
        // 10 observations: 8 in (40, 50] ms, 2 over 50 s. p99 (rank 9.9) falls in (50000, +Inf], and
        // Prometheus reports 50000 rather than interpolating towards infinity.
        let mut c = vec![0.0; 9];
        c.resize(25, 8.0);
        c.push(10.0);
        let b = linkerd(&c);
        assert_eq!(histogram_quantile(0.99, &b), Some(50000.0));
        // p50 (rank 5) is in (40, 50]: the 8 observations there, 40 + 10 × 5/8 = 46.25.
        assert_eq!(histogram_quantile(0.5, &b), Some(46.25));
    }

    #[test]
    fn nan_cases_are_none() {
        assert_eq!(histogram_quantile(0.5, &[]), None);
        // No observations.
        assert_eq!(histogram_quantile(0.5, &linkerd(&[0.0; 26])), None);
        // No +Inf bucket.
        assert_eq!(histogram_quantile(0.5, &[(1.0, 1.0), (2.0, 2.0)]), None);
        // Only the +Inf bucket.
        assert_eq!(histogram_quantile(0.5, &[(INF, 3.0)]), None);
    }

    #[test]
    fn order_duplicates_and_non_monotonic_counts() {
        // Given in any order, `le` spelled twice (two series summed by `le`), and a bucket
        // below its predecessor (a reset seen in one bucket only): merged, then the running
        // maximum. Buckets become (1: 2+2=4), (2: max(4, 3)=4), (4: 8), (+Inf: 8).
        let b = [(INF, 8.0), (2.0, 3.0), (1.0, 2.0), (4.0, 8.0), (1.0, 2.0)];
        // p75: rank 6 → le=4 (8), from 2 (4): 2 + 2 × (6 − 4)/(8 − 4) = 3.
        assert_eq!(histogram_quantile(0.75, &b), Some(3.0));
        // p50: rank 4 → le=1 (4): 0 + 1 × 4/4 = 1.
        assert_eq!(histogram_quantile(0.5, &b), Some(1.0));
    }
}
