//! Percentiles and small summary helpers.
//!
//! Contract: `percentile(values, p)` is the linear-interpolation percentile (numpy's default)
//! of the finite values, `None` when there are none.

/// Linear-interpolation percentile, p in [0, 100].
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = (p.clamp(0.0, 100.0) / 100.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    Some(v[lo] + (v[hi] - v[lo]) * (rank - lo as f64))
}

/// p50/p90/p99 of the values.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct Quantiles {
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub mean: Option<f64>,
}

impl Quantiles {
    pub fn of(values: &[f64]) -> Self {
        let mean = (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64);
        Quantiles { p50: percentile(values, 50.0), p90: percentile(values, 90.0), p99: percentile(values, 99.0), mean }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_linear() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), Some(2.5));
        assert!((percentile(&v, 90.0).unwrap() - 3.7).abs() < 1e-12);
        assert_eq!(percentile(&[5.0], 99.0), Some(5.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[3.0, f64::NAN, 1.0], 0.0), Some(1.0));
        let q = Quantiles::of(&[1.0, 3.0]);
        assert_eq!(q.mean, Some(2.0));
    }
}
