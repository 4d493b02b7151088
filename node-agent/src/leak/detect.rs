//! The leak detectors, as pure functions over a series of memory points: a least-squares
//! trend with a real R², composition (anonymous vs file-backed growth), thresholds on
//! sustained growth, and the 0-100 confidence that combines them. See `README.md` here
//! for what each part weighs and why.

/// One point of a series: seconds (monotonic), resident bytes, and the anonymous-like
/// part of them (anon + shmem).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Point {
    pub t: f64,
    pub rss: f64,
    pub anon: f64,
}

/// A least-squares line `rss = intercept + slope * t`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    pub slope: f64,
    pub intercept: f64,
    /// Coefficient of determination, 1 - SS_res / SS_tot: 1 for points on a line, about 0
    /// for noise around a flat mean. Defined as 0 when the points do not vary.
    pub r2: f64,
    pub n: usize,
}

/// Fits a line through `(x, y)` pairs. None for fewer than two distinct x.
pub fn fit(xs: &[f64], ys: &[f64]) -> Option<Fit> {
    let n = xs.len().min(ys.len());
    if n < 2 {
        return None;
    }
    // Centre on the means before summing: the raw sums of squares of monotonic-clock
    // seconds and byte counts lose all precision in f64.
    let mx = xs[..n].iter().sum::<f64>() / n as f64;
    let my = ys[..n].iter().sum::<f64>() / n as f64;
    let (mut sxx, mut sxy, mut syy) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let (dx, dy) = (xs[i] - mx, ys[i] - my);
        sxx += dx * dx;
        sxy += dx * dy;
        syy += dy * dy;
    }
    if sxx <= f64::EPSILON {
        return None;
    }
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    // SS_res = SS_tot - slope * S_xy for the least-squares line.
    let r2 = if syy <= f64::EPSILON {
        0.0
    } else {
        (1.0 - (syy - slope * sxy) / syy).clamp(0.0, 1.0)
    };
    Some(Fit {
        slope,
        intercept,
        r2,
        n,
    })
}

/// Tunables of the detectors. The defaults are what README.md documents.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// A fall of at least this much from the running peak ends a growth run...
    pub drop_min_bytes: f64,
    /// ...or this fraction of the peak, whichever is larger.
    pub drop_min_fraction: f64,
    /// Growth below this is noise, whatever its shape.
    pub min_growth_bytes: f64,
    /// A series younger than this is capped at `young_cap`: its first rising edge (a
    /// sawtooth's, a warm-up's, a start-up allocation's) has no history to tell it from a
    /// leak, and the RSS a process inherits at fork or has at exec can fake any growth.
    pub young_secs: f64,
    pub young_cap: f64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            drop_min_bytes: 2.0 * 1048576.0,
            drop_min_fraction: 0.05,
            min_growth_bytes: 2.0 * 1048576.0,
            young_secs: 30.0,
            young_cap: 50.0,
        }
    }
}

/// The parts of a confidence, for debugging and for the README's table.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Components {
    /// 0-40 from R² of the window. The next three parts are scaled by how well the window
    /// fits a trend (0 at R² 0.85, 1 at 0.97).
    pub trend: f64,
    /// 0-25 from how much the run grew, in bytes (log scale).
    pub magnitude: f64,
    /// 0-20 from how long (in points) the run has kept growing.
    pub duration: f64,
    /// 0-15 from growth relative to the run's starting size.
    pub relative: f64,
    /// Multipliers in 0-1.
    pub composition: f64,
    pub linearity: f64,
    pub oscillation: f64,
}

/// What the detectors conclude about one series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub confidence: u8,
    /// Of the current growth run, bytes per second.
    pub slope: f64,
    pub r2: f64,
    /// Seconds the current run has lasted.
    pub run_secs: f64,
    pub components: Components,
}

/// Index where the current growth run starts: just after the last significant fall from
/// a running peak (a GC cycle, a freed burst), or 0.
pub fn run_start(points: &[Point], p: &Params) -> usize {
    let mut peak = f64::MIN;
    let mut start = 0;
    for (i, pt) in points.iter().enumerate() {
        if pt.rss > peak {
            peak = pt.rss;
        }
        let drop = peak - pt.rss;
        if drop >= p.drop_min_bytes.max(p.drop_min_fraction * peak) {
            start = i;
            peak = pt.rss;
        }
    }
    start
}

/// Largest fall from a running peak anywhere in `points`, in bytes.
fn largest_drop(points: &[Point]) -> f64 {
    let mut peak = f64::MIN;
    let mut worst: f64 = 0.0;
    for pt in points {
        peak = peak.max(pt.rss);
        worst = worst.max(peak - pt.rss);
    }
    worst
}

fn ramp(x: f64, lo: f64, hi: f64) -> f64 {
    ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
}

/// Scores a series (oldest first). `age_secs` is how long the series has been observed.
///
/// Windows of several lengths ending at the newest point are scored and the best one
/// wins: a short window sees a fast leak within seconds, a long one a slow leak that only
/// stands out of the noise over many minutes, and a leak that starts after a long flat
/// period is not diluted by it. No window reaches back past the last significant fall.
pub fn assess(points: &[Point], age_secs: f64, p: &Params) -> Option<Verdict> {
    let start = run_start(points, p);
    let run_len = points.len() - start;
    if run_len < 3 {
        return None;
    }
    let mut best: Option<Verdict> = None;
    let mut w = 3usize;
    loop {
        let w_now = w.min(run_len);
        if let Some(v) = score_window(points, start, points.len() - w_now, age_secs, p)
            && best.is_none_or(|b| {
                v.confidence > b.confidence || (v.confidence == b.confidence && w_now == run_len)
            })
        {
            best = Some(v);
        }
        if w_now == run_len {
            break;
        }
        w = (w * 3).div_ceil(2);
    }
    best
}

fn score_window(
    points: &[Point],
    run_from: usize,
    from: usize,
    age_secs: f64,
    p: &Params,
) -> Option<Verdict> {
    let run = &points[from..];
    let ts: Vec<f64> = run.iter().map(|x| x.t).collect();
    let ys: Vec<f64> = run.iter().map(|x| x.rss).collect();
    let f = fit(&ts, &ys)?;
    let run_secs = ts[ts.len() - 1] - ts[0];
    let first = run[0];
    let last = run[run.len() - 1];
    let growth = (f.slope * run_secs).max(0.0);
    let mut c = Components::default();
    if f.slope <= 0.0 || growth < p.min_growth_bytes {
        return Some(Verdict {
            confidence: 0,
            slope: f.slope,
            r2: f.r2,
            run_secs,
            components: c,
        });
    }

    c.trend = 40.0 * ramp(f.r2, 0.80, 0.97);
    c.magnitude = 25.0 * ramp((growth / p.min_growth_bytes).log2(), 0.0, 3.0);
    // Points that set a new high: a leak keeps setting them, noise does not.
    let mut highs = 0usize;
    let mut top = f64::MIN;
    for y in &ys {
        if *y > top + 4096.0 {
            highs += 1;
            top = *y;
        }
    }
    c.duration = 20.0 * ramp(highs as f64, 2.0, 8.0);
    let rel = (last.rss - first.rss) / first.rss.max(1.0);
    c.relative = 15.0 * ramp(rel, 0.0, 0.5);

    // Composition: file-backed growth is page cache the kernel can reclaim, not a leak.
    let anon_growth = last.anon - first.anon;
    let rss_growth = (last.rss - first.rss).max(1.0);
    c.composition = ramp(anon_growth / rss_growth, 0.3, 0.7);

    // Linearity: a cache warming up grows fast and then slower and slower; a leak keeps
    // its rate. Compare the slope of the window's later half to its earlier half.
    c.linearity = 1.0;
    if run.len() >= 6 {
        let mid = run.len() / 2;
        if let (Some(e), Some(l)) = (fit(&ts[..mid], &ys[..mid]), fit(&ts[mid..], &ys[mid..]))
            && e.slope > 0.0
        {
            c.linearity = ramp(l.slope / e.slope, 0.3, 0.7);
        }
    }

    // The same against the window just before this one (within the run): a short window
    // on the tail of a warm-up is locally straight, but much slower than what preceded it.
    // A leak that starts after a flat period has a preceding slope near zero: no penalty.
    let len = run.len();
    if from >= run_from + len {
        let prev = &points[from - len..from];
        let pts: Vec<f64> = prev.iter().map(|x| x.t).collect();
        let pys: Vec<f64> = prev.iter().map(|x| x.rss).collect();
        if let Some(before) = fit(&pts, &pys)
            && before.slope > 0.0
        {
            c.linearity = c.linearity.min(ramp(f.slope / before.slope, 0.3, 0.8));
        }
    }

    // Oscillation: a series that earlier fell by as much as this window grew (a GC
    // sawtooth, freed bursts) is cycling, unless it has now climbed well past the peaks
    // of those cycles.
    c.oscillation = 1.0;
    let history = &points[..=from];
    let cycle = largest_drop(history);
    if cycle > 0.3 * growth {
        let prior_peak = history.iter().map(|x| x.rss).fold(f64::MIN, f64::max);
        let beyond = (last.rss - prior_peak) / cycle.max(1.0);
        c.oscillation = 0.3 + 0.7 * ramp(beyond, 1.0, 3.0);
    }

    // Size, duration and relative growth only mean something for a series that is a trend:
    // a process allocating its heap at start-up is one big step, not a leak.
    let gate = ramp(f.r2, 0.85, 0.97);
    let mut score = (c.trend + (c.magnitude + c.duration + c.relative) * gate)
        * c.composition
        * c.linearity
        * c.oscillation;
    if age_secs < p.young_secs {
        score = score.min(p.young_cap);
    }
    Some(Verdict {
        confidence: score.round().clamp(0.0, 100.0) as u8,
        slope: f.slope,
        r2: f.r2,
        run_secs,
        components: c,
    })
}

/// Seconds until `usage` reaches `limit` at `slope` bytes/s; None when the trend does not
/// support a number (not growing, or already past the limit).
pub fn time_to_limit(usage: f64, limit: f64, slope: f64) -> Option<f64> {
    if slope <= 0.0 || !slope.is_finite() {
        return None;
    }
    let left = limit - usage;
    if left <= 0.0 {
        return Some(0.0);
    }
    Some(left / slope)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: f64 = 1048576.0;

    /// The kernel streams samples at >= 1 MiB moves, at most one per second, and user
    /// space adds a sample every 2 s from the exact sketch: model both.
    fn series(secs: f64, f: impl Fn(f64) -> (f64, f64)) -> Vec<Point> {
        let mut pts = Vec::new();
        let mut last_emit = f64::MIN;
        let mut t = 0.0;
        while t <= secs + 1e-9 {
            let (rss, anon) = f(t);
            let heartbeat = (t / 2.0).fract() < 1e-9;
            if heartbeat || (rss - last_emit).abs() >= MIB {
                pts.push(Point { t, rss, anon });
                last_emit = rss;
            }
            t += 1.0;
        }
        pts
    }

    /// Seconds until confidence >= 60 for a leak starting at `leak_start` on a 10 MiB
    /// baseline, scanning each second as the agent would.
    fn detection_secs(rate: f64, leak_start: f64, max: f64) -> Option<f64> {
        let f = |t: f64| {
            let rss = 10.0 * MIB + rate * (t - leak_start).max(0.0);
            (rss, rss - 2.0 * MIB)
        };
        let mut now = leak_start;
        while now <= leak_start + max {
            let pts = series(now, f);
            if let Some(v) = assess(&pts, now, &Params::default())
                && v.confidence >= 60
            {
                return Some(now - leak_start);
            }
            now += 1.0;
        }
        None
    }

    /// Highest confidence a pattern ever reaches over `secs`, evaluated every second.
    fn max_confidence(secs: f64, f: impl Fn(f64) -> (f64, f64) + Copy) -> u8 {
        let mut worst = 0;
        let mut now = 3.0;
        while now <= secs {
            if let Some(v) = assess(&series(now, f), now, &Params::default()) {
                worst = worst.max(v.confidence);
            }
            now += 1.0;
        }
        worst
    }

    #[test]
    fn r2_matches_a_hand_computed_example() {
        // y = 1, 3, 2, 5 at x = 0..3: slope 1.1, intercept 1.1, SS_tot 8.75, SS_res 2.7.
        let f = fit(&[0.0, 1.0, 2.0, 3.0], &[1.0, 3.0, 2.0, 5.0]).expect("fit");
        assert!((f.slope - 1.1).abs() < 1e-12);
        assert!((f.intercept - 1.1).abs() < 1e-12);
        assert!((f.r2 - (1.0 - 2.7 / 8.75)).abs() < 1e-12, "r2 = {}", f.r2);
        // A perfect line, and noise with no trend.
        assert!((fit(&[0.0, 1.0, 2.0], &[5.0, 7.0, 9.0]).expect("fit").r2 - 1.0).abs() < 1e-12);
        assert!(
            fit(&[0.0, 1.0, 2.0, 3.0], &[5.0, 6.0, 5.0, 6.0])
                .expect("fit")
                .r2
                < 0.3
        );
        assert!(fit(&[1.0], &[1.0]).is_none());
    }

    #[test]
    fn r2_is_not_a_constant_for_positive_slopes() {
        // The anchor's flaw: any positive slope scored the same "R²".
        let clean = fit(&[0.0, 1.0, 2.0, 3.0, 4.0], &[0.0, 1.0, 2.0, 3.0, 4.0]).expect("fit");
        let noisy = fit(&[0.0, 1.0, 2.0, 3.0, 4.0], &[0.0, 3.0, 0.5, 4.0, 2.5]).expect("fit");
        assert!(clean.slope > 0.0 && noisy.slope > 0.0);
        assert!(
            clean.r2 > 0.99 && noisy.r2 < 0.6,
            "{} vs {}",
            clean.r2,
            noisy.r2
        );
    }

    #[test]
    fn fit_survives_monotonic_clock_magnitudes() {
        // Seconds since boot ~1e6 and byte counts ~1e10 must not lose the slope.
        let xs: Vec<f64> = (0..10).map(|i| 1.0e6 + i as f64).collect();
        let ys: Vec<f64> = (0..10).map(|i| 1.0e10 + 1000.0 * i as f64).collect();
        let f = fit(&xs, &ys).expect("fit");
        assert!((f.slope - 1000.0).abs() < 1e-6 && f.r2 > 0.999_999);
    }

    #[test]
    fn detects_leaks_within_the_goals() {
        let cases = [
            (10.0 * MIB, 2.0),
            (1.0 * MIB, 10.0),
            (100.0 * 1024.0, 60.0),
            (10.0 * 1024.0, 600.0),
        ];
        for (rate, goal) in cases {
            // The leak starts after 60 s of flat history, so the series is not young.
            let got = detection_secs(rate, 60.0, goal * 3.0);
            assert!(
                got.is_some_and(|s| s <= goal),
                "{} B/s detected after {got:?} s, goal {goal} s",
                rate
            );
        }
        // A leak that starts with its process is held at 50 for the first 30 s, then found.
        assert!(detection_secs(10.0 * MIB, 0.0, 29.0).is_none());
        assert!(detection_secs(10.0 * MIB, 0.0, 40.0).is_some_and(|s| s <= 31.0));
    }

    #[test]
    fn stable_patterns_never_reach_60_over_ten_minutes() {
        let base = 100.0 * MIB;
        let secs = 600.0;
        let flat = |_t: f64| (base, base * 0.9);
        // GC: +2 MiB/s for 10 s, then back to the baseline.
        let sawtooth = |t: f64| {
            let rss = base + 2.0 * MIB * (t % 10.0);
            (rss, rss - 10.0 * MIB)
        };
        // Cache warm-up: +60 MiB approached exponentially (tau 10 s), then flat.
        let plateau = |t: f64| {
            let rss = 50.0 * MIB + 60.0 * MIB * (1.0 - (-t / 10.0).exp());
            (rss, rss - 5.0 * MIB)
        };
        // Bursts: 40 MiB allocated at once for 3 s of every 7 s.
        let bursty = |t: f64| {
            let rss = base + if t % 7.0 < 3.0 { 40.0 * MIB } else { 0.0 };
            (rss, rss - 10.0 * MIB)
        };
        // Page cache: file-backed growth of 5 MiB/s up to 500 MiB.
        let pagecache = |t: f64| {
            let file = (5.0 * MIB * t).min(500.0 * MIB);
            (20.0 * MIB + file, 15.0 * MIB)
        };
        for (name, worst) in [
            ("flat", max_confidence(secs, flat)),
            ("sawtooth", max_confidence(secs, sawtooth)),
            ("plateau", max_confidence(secs, plateau)),
            ("bursty", max_confidence(secs, bursty)),
            ("pagecache", max_confidence(secs, pagecache)),
        ] {
            assert!(worst < 60, "{name} reached confidence {worst}");
        }
    }

    #[test]
    fn a_start_up_allocation_is_not_a_leak() {
        // Exec-time RSS, then a 100 MiB heap allocated within the first second, then flat.
        let f = |t: f64| {
            let rss = if t < 1.0 { MIB } else { 100.0 * MIB };
            (rss, rss * 0.9)
        };
        assert!(max_confidence(120.0, f) < 40);
    }

    #[test]
    fn a_leak_on_top_of_a_sawtooth_is_still_found() {
        let f = |t: f64| {
            let rss = 100.0 * MIB + 2.0 * MIB * (t % 10.0) + 0.5 * MIB * t;
            (rss, rss - 10.0 * MIB)
        };
        assert!(max_confidence(600.0, f) >= 60);
    }

    #[test]
    fn time_to_limit_is_none_without_growth() {
        assert_eq!(time_to_limit(50.0, 100.0, 0.0), None);
        assert_eq!(time_to_limit(50.0, 100.0, -1.0), None);
        assert_eq!(time_to_limit(50.0, 100.0, 5.0), Some(10.0));
        assert_eq!(time_to_limit(150.0, 100.0, 5.0), Some(0.0));
    }
}
