//! The leak detectors, as pure functions over a series of memory points: a least-squares
//! trend with a real R², composition (anonymous vs file-backed growth), thresholds on
//! sustained growth, and the 0-100 confidence that combines them. See `README.md` here
//! for what each part weighs and why.

use std::borrow::Cow;

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
    /// ...or this fraction of the peak, or `drop_noise` times the series' noise, whichever
    /// is largest (a process that jitters by a few MiB per request is not cycling).
    pub drop_min_fraction: f64,
    pub drop_noise: f64,
    /// Growth below this is noise, whatever its shape.
    pub min_growth_bytes: f64,
    /// Points this close to the process's start are not scored: exec and the runtime's
    /// initialisation are one step, not a trend.
    pub startup_secs: f64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            drop_min_bytes: 2.0 * 1048576.0,
            drop_min_fraction: 0.05,
            drop_noise: 4.0,
            min_growth_bytes: 2.0 * 1048576.0,
            startup_secs: 2.0,
        }
    }
}

/// What is known about a series besides its points (seconds on CLOCK_MONOTONIC).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Context {
    /// When the process (or the container's oldest process) started.
    pub start_t: f64,
    pub now_t: f64,
    /// The highest resident size the series ever had, from before it was observed (0: none
    /// known).
    pub prior_peak: f64,
    /// Bytes left before the tightest memory limit.
    pub headroom: Option<f64>,
    /// Page cache charged to that limit, which the kernel reclaims before the OOM kill.
    pub reclaimable: f64,
}

/// The parts of a confidence, for debugging and for the README's table.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Components {
    /// 0-40 from R² of the window (or of its lower envelope).
    pub trend: f64,
    /// 0-25 from how much the window grew: in bytes (log scale) or against the headroom.
    pub magnitude: f64,
    /// 0-20 from how many new highs the window set.
    pub duration: f64,
    /// 0-15 from growth relative to the window's starting size.
    pub relative: f64,
    /// Multipliers in 0-1.
    pub composition: f64,
    pub linearity: f64,
    pub oscillation: f64,
    pub freshness: f64,
    /// How much of a process's growth its container's charge shows (`LeakTracker::
    /// assess_in`); 1 when the container is not a series of its own. Unset (0) on
    /// verdicts `assess` makes.
    pub charged: f64,
    /// How much a JVM's resident growth is asked (`LeakTracker::assess_in`): 0.5 when its
    /// collector kept the retained heap flat over the window and no limit is near, up to
    /// 1 as the heap grows; 1 for anything else. Unset (0) on verdicts `assess` makes.
    pub runtime: f64,
    /// What was fitted: the window's points, its lower envelope, or the troughs between
    /// collections.
    pub fitted: Fitted,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fitted {
    #[default]
    Points,
    Envelope,
    Troughs,
    Steps,
}

/// A time-to-OOM prediction: the point estimate and a lower bound (seconds).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Eta {
    pub secs: f64,
    pub low_secs: f64,
}

/// What the detectors conclude about one series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    pub confidence: u8,
    /// Bytes per second: the recent growth rate (what the time to OOM uses).
    pub slope: f64,
    pub r2: f64,
    /// Seconds the scored window spans.
    pub run_secs: f64,
    /// How long the growth has been held at leak level (>= 60): the span of the longest
    /// window (or of the troughs) scoring that. 0 below 60. Remediation waits until a leak
    /// has grown at least as long as it has left: a warm-up slows down before that.
    pub growing_secs: f64,
    pub components: Components,
    /// Against `Context::headroom`; None without a limit or when the trend does not
    /// support a number (not growing, or slowing down so that it levels off first).
    pub eta: Option<Eta>,
}

/// Noise of a series: 1.4826 x the median absolute deviation of its successive changes
/// (0 for a straight line however steep; about the jitter's size for a jittery process).
pub fn noise(points: &[Point]) -> f64 {
    if points.len() < 4 {
        return 0.0;
    }
    let mut d: Vec<f64> = points.windows(2).map(|w| w[1].rss - w[0].rss).collect();
    let med = median(&mut d);
    let mut dev: Vec<f64> = d.iter().map(|x| (x - med).abs()).collect();
    1.4826 * median(&mut dev)
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The fall that counts as a cycle (a GC, a freed batch) rather than jitter.
fn significant_drop(peak: f64, noise: f64, p: &Params) -> f64 {
    p.drop_min_bytes
        .max(p.drop_min_fraction * peak)
        .max(p.drop_noise * noise)
}

/// The rise that starts a new level of a staircase: above the jitter and half the
/// growth that counts.
fn step_rise(noise: f64, p: &Params) -> f64 {
    (p.min_growth_bytes / 2.0).max(p.drop_noise * noise)
}

/// Index where the current growth run starts: just after the last significant fall from
/// a running peak (a GC cycle, a freed burst), or 0.
pub fn run_start(points: &[Point], noise: f64, p: &Params) -> usize {
    let mut peak = f64::MIN;
    let mut start = 0;
    for (i, pt) in points.iter().enumerate() {
        if pt.rss > peak {
            peak = pt.rss;
        }
        if peak - pt.rss >= significant_drop(peak, noise, p) {
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

pub(crate) fn ramp(x: f64, lo: f64, hi: f64) -> f64 {
    ((x - lo) / (hi - lo)).clamp(0.0, 1.0)
}

/// The lower envelope of `run`: the lowest point of each of about 12 consecutive buckets
/// of at least 4 points. What a process holds between its requests or collections: the
/// jitter of scratch buffers and the teeth of a sawtooth shorter than a bucket are gone,
/// and a leak under them remains.
fn envelope(run: &[Point]) -> Vec<Point> {
    let bucket = (run.len() / 12).max(4);
    run.chunks(bucket)
        .filter(|c| c.len() * 2 >= bucket)
        .filter_map(|c| c.iter().copied().min_by(|a, b| a.rss.total_cmp(&b.rss)))
        .collect()
}

/// A staircase seen at its corners: the last point of each level (a level is a stretch
/// of points within `rise` of its first one), and the newest point. A runtime that grows
/// its heap in steps (G1 committing regions, V8 promoting at each scavenge) holds flat
/// for seconds to minutes between them: fitted point by point, a leak under it looks
/// like a few jumps (a poor line) or a flat tail (no growth), depending on where the
/// window ends. The corners of a steady staircase lie on a line whatever the phase; a
/// staircase that stops stepping shows it as its newest corner drifts right at the same
/// level. On a smooth series every point is its own level, and nothing changes.
fn steps(run: &[Point], rise: f64) -> Vec<Point> {
    let mut out = Vec::new();
    let mut base = run[0].rss;
    for w in run.windows(2) {
        if w[1].rss - base >= rise {
            out.push(w[0]);
            base = w[1].rss;
        }
    }
    out.push(run[run.len() - 1]);
    out
}

/// How fresh a window's growth is: 1 while its newest high (a rise of `rise` over the
/// level of the previous one) is less than 30 s old or no older than 1.5 times the
/// longest gap between its earlier highs, 0 from 2.5 times. A leak keeps stepping at its
/// own pace, however irregular; a warm-up that stopped has gone quiet for longer than it
/// ever paused. 1 with fewer than two gaps to compare with. (A runtime pausing for a
/// collection or a G1 heap resize is quiet for 10-20 s: the 30 s.)
fn freshness(raw: &[Point], rise: f64) -> f64 {
    let mut level = raw[0].rss;
    let mut last: Option<f64> = None;
    let mut longest: f64 = 0.0;
    let mut gaps = 0;
    for p in raw {
        if p.rss >= level + rise {
            if let Some(t) = last {
                longest = longest.max(p.t - t);
                gaps += 1;
            }
            last = Some(p.t);
            level = p.rss;
        }
    }
    match last {
        Some(t) if gaps >= 2 && longest > 0.0 && raw[raw.len() - 1].t - t >= 30.0 => {
            ramp(2.5 - (raw[raw.len() - 1].t - t) / longest, 0.0, 1.0)
        }
        _ => 1.0,
    }
}

/// Scores a series (oldest first).
///
/// Windows of several lengths ending at the newest point are scored and the best one
/// wins: a short window sees a fast leak within seconds, a long one a slow leak that only
/// stands out of the noise over many minutes, and a leak that starts after a long flat
/// period is not diluted by it. No window reaches back past the last significant fall.
pub fn assess(points: &[Point], ctx: &Context, p: &Params) -> Option<Verdict> {
    let skip = points
        .iter()
        .position(|x| x.t >= ctx.start_t + p.startup_secs)
        .unwrap_or(points.len());
    let points = &points[skip..];
    if points.len() < 3 {
        return None;
    }
    let noise = noise(&points[points.len().saturating_sub(120)..]);
    let start = run_start(points, noise, p);
    let run_len = points.len() - start;
    let mut best: Option<Verdict> = None;
    let mut growing: f64 = 0.0;
    // Windows need 3 points; just after a fall only the troughs below can say anything.
    let mut w = if run_len >= 3 { 3usize } else { usize::MAX };
    while w != usize::MAX {
        let w_now = w.min(run_len);
        for how in [Fitted::Points, Fitted::Envelope, Fitted::Steps] {
            if how == Fitted::Envelope && w_now < 24 {
                continue;
            }
            let v = score_window(points, start, points.len() - w_now, how, noise, ctx, p);
            if let Some(v) = v
                && v.confidence >= 60
            {
                growing = growing.max(v.run_secs);
            }
            if let Some(v) = v
                && best.is_none_or(|b| {
                    v.confidence > b.confidence
                        || (v.confidence == b.confidence && w_now == run_len)
                })
            {
                best = Some(v);
            }
        }
        w = if w_now == run_len {
            usize::MAX
        } else {
            (w * 3).div_ceil(2)
        };
    }
    // A leak under a collector with a long cycle: every run ends in a fall, but what is
    // left after each collection keeps rising. Scored on the troughs: the lowest point of
    // each run (the first's included), and the current run's lowest so far.
    if start > 0
        && let Some(v) = score_window(points, 0, 0, Fitted::Troughs, noise, ctx, p)
    {
        if v.confidence >= 60 {
            growing = growing.max(v.run_secs);
        }
        if best.is_none_or(|b| v.confidence > b.confidence) {
            best = Some(v);
        }
    }
    let mut best = best?;
    best.growing_secs = if best.confidence >= 60 { growing } else { 0.0 };
    if let Some(h) = ctx.headroom {
        let (slope, eta) = time_to_oom(&points[start..], best.run_secs, h, ctx.reclaimable);
        best.slope = slope;
        best.eta = eta;
    }
    Some(best)
}

/// The lowest point of each completed run between significant falls, oldest first, or
/// nothing when the cycles have stopped (the current run has lasted more than twice the
/// longest completed one): old troughs then say nothing about now, e.g. the small
/// collections of a warm-up long over. A current run already as long as the longest
/// completed one adds its level now (the lowest of its last quarter): a warm-up's last
/// collection followed by a flat minute is flat, not rising. A shorter one is still
/// climbing its cycle and adds nothing.
fn troughs(points: &[Point], noise: f64, p: &Params) -> Vec<Point> {
    let lowest = |v: &[Point]| v.iter().copied().min_by(|a, b| a.rss.total_cmp(&b.rss));
    let mut out = Vec::new();
    let mut peak = f64::MIN;
    let mut run_start = 0;
    let mut longest: f64 = 0.0;
    for (i, pt) in points.iter().enumerate() {
        peak = peak.max(pt.rss);
        if peak - pt.rss >= significant_drop(peak, noise, p) {
            out.extend(lowest(&points[run_start..i]));
            longest = longest.max(pt.t - points[run_start].t);
            run_start = i;
            peak = pt.rss;
        }
    }
    let current = points[points.len() - 1].t - points[run_start].t;
    if current > 2.0 * longest {
        out.clear();
    } else if current >= longest {
        let run = &points[run_start..];
        let tail = (run.len() / 4).max(3).min(run.len());
        out.extend(lowest(&run[run.len() - tail..]));
    }
    out
}

fn score_window(
    points: &[Point],
    run_from: usize,
    from: usize,
    how: Fitted,
    noise: f64,
    ctx: &Context,
    p: &Params,
) -> Option<Verdict> {
    let raw = &points[from..];
    let run = fitted_points(raw, how, noise, p)?;
    let run: &[Point] = &run;
    let ts: Vec<f64> = run.iter().map(|x| x.t).collect();
    let ys: Vec<f64> = run.iter().map(|x| x.rss).collect();
    let f = fit(&ts, &ys)?;
    // A staircase's span starts at its first corner: the level before it is flat, and
    // the rate (time to OOM) and how long the growth has lasted are measured from there
    // (a leak starting after 30 s flat is a corner and a climb, not 30 s of growth).
    let run_secs = if how == Fitted::Steps {
        ts[ts.len() - 1] - ts[0]
    } else {
        raw[raw.len() - 1].t - raw[0].t
    };
    let first = run[0];
    let last = run[run.len() - 1];
    let growth = (f.slope * (ts[ts.len() - 1] - ts[0])).max(0.0);
    let mut c = Components {
        fitted: how,
        ..Default::default()
    };
    let verdict = |confidence: u8, c: Components| Verdict {
        confidence,
        slope: f.slope,
        r2: f.r2,
        run_secs,
        growing_secs: 0.0,
        components: c,
        eta: None,
    };
    if f.slope <= 0.0 || growth < p.min_growth_bytes {
        return Some(verdict(0, c));
    }

    // A trend that reaches the limit within half a minute is urgent even when rough (a
    // runtime stepping its heap up at start-up): R² is asked less of it, down to 0.15
    // less when the line hits the limit within 30 s, nothing less beyond 2 minutes.
    let urgency = ctx
        .headroom
        .map_or(0.0, |h| ramp(120.0 - h.max(0.0) / f.slope, 0.0, 90.0));
    let relax = 0.15 * urgency;
    c.trend = 40.0 * ramp(f.r2, 0.80 - relax, 0.97 - relax);
    size_components(&mut c, growth, &ys, ctx, p);
    // Composition: file-backed growth is page cache the kernel can reclaim, not a leak.
    c.composition = ramp(
        (last.anon - first.anon) / (last.rss - first.rss).max(1.0),
        0.3,
        0.7,
    );
    c.linearity = linearity(
        &ts,
        &ys,
        f.slope,
        urgency,
        how,
        (points, run_from, from),
        noise,
        p,
    );
    // Troughs: the cycles are what was looked through.
    c.oscillation = if how == Fitted::Troughs {
        1.0
    } else {
        oscillation(&points[..=from], last.rss, growth, noise, ctx, p)
    };

    c.freshness = window_freshness(raw, how, noise, ctx, p);
    let score = combined(&c, f.r2, relax, how, run.len());
    Some(verdict(score, c))
}

/// Whether the window still sets new highs. Troughs have their own rule for cycles that
/// stopped. A series at its limit cannot set new highs while the kernel reclaims its
/// page cache before the kill.
fn window_freshness(raw: &[Point], how: Fitted, noise: f64, ctx: &Context, p: &Params) -> f64 {
    let rise = step_rise(noise, p);
    let pinned = ctx.headroom.is_some_and(|h| h < 2.0 * rise);
    if how == Fitted::Troughs || pinned {
        1.0
    } else {
        freshness(raw, rise)
    }
}

/// Magnitude, duration and relative growth of a window's `growth` (bytes).
fn size_components(c: &mut Components, growth: f64, ys: &[f64], ctx: &Context, p: &Params) {
    // A growth that has eaten a good part of what is left before the limit is large
    // whatever its size in MiB: an imminent OOM kill is urgent from the first seconds.
    let of_headroom = ctx.headroom.map_or(0.0, |h| growth / h.max(1.0));
    c.magnitude = 25.0
        * ramp((growth / p.min_growth_bytes).log2(), 0.0, 3.0).max(ramp(of_headroom, 0.05, 0.5));
    c.duration = 20.0 * ramp(new_highs(ys) as f64, 2.0, 8.0);
    c.relative = 15.0 * ramp(growth / ys[0].max(1.0), 0.0, 0.5);
}

/// Linearity: a cache warming up grows fast and then slower and slower; a leak keeps its
/// rate. `window` is the series, where the run starts and where this window starts.
#[allow(clippy::too_many_arguments)]
fn linearity(
    ts: &[f64],
    ys: &[f64],
    slope: f64,
    urgency: f64,
    how: Fitted,
    (points, run_from, from): (&[Point], usize, usize),
    noise: f64,
    p: &Params,
) -> f64 {
    // Urgent growth is asked less: a runtime stepping up towards its limit pauses between
    // steps, which reads as slowing down.
    let mut linearity = halves_linearity(ts, ys, how).max(urgency);
    // The same against the window just before this one (within the run): a short window
    // on the tail of a warm-up is locally straight, but much slower than what preceded it.
    // A leak that starts after a flat period has a preceding slope near zero: no penalty.
    let len = points.len() - from;
    if how != Fitted::Troughs
        && from >= run_from + len
        && let Some(before) = slope_before(&points[from - len..from], how, noise, p)
    {
        linearity = linearity.min(ramp(slope / before, 0.3, 0.8));
    }
    linearity
}

/// The 0-100 score of a window's components. `r2`: its fit; `relax`: how much less an
/// urgent trend is asked; `fitted`: how many points the fit went through.
fn combined(c: &Components, r2: f64, relax: f64, how: Fitted, fitted: usize) -> u8 {
    // Size, duration and relative growth only mean something for a series that is a trend:
    // a process allocating its heap at start-up is one big step, not a leak.
    let gate = ramp(r2, 0.85 - relax, 0.97 - relax);
    // A staircase of a few levels is a few events (an allocator taking a new arena now
    // and then), whatever line they happen to fall on: full credit from 7 corners.
    let levels = if how == Fitted::Steps {
        ramp(fitted as f64, 3.0, 7.0)
    } else {
        1.0
    };
    let score = (c.trend + (c.magnitude + c.duration + c.relative) * gate)
        * c.composition
        * c.linearity
        * c.oscillation
        * c.freshness
        * levels;
    score.round().clamp(0.0, 100.0) as u8
}

/// The points a window is fitted through: as sampled, or derived (the lower envelope,
/// the troughs between collections, the corners of a staircase); None when the derived
/// series is too short to fit.
fn fitted_points<'a>(
    raw: &'a [Point],
    how: Fitted,
    noise: f64,
    p: &Params,
) -> Option<Cow<'a, [Point]>> {
    let derived = match how {
        Fitted::Points => return Some(Cow::Borrowed(raw)),
        Fitted::Envelope => Some(envelope(raw)).filter(|d| d.len() >= 6),
        // Four, so that the halves can say whether they slow down.
        Fitted::Troughs => Some(troughs(raw, noise, p)).filter(|d| d.len() >= 4),
        // Not a staircase (every point its own level): the points path has it.
        Fitted::Steps => Some(steps(raw, step_rise(noise, p)))
            .filter(|d| d.len() >= 4 && d.len() * 2 <= raw.len()),
    }?;
    Some(Cow::Owned(derived))
}

/// The rising slope of the window before this one, fitted the same way; None when it did
/// not rise.
fn slope_before(prev: &[Point], how: Fitted, noise: f64, p: &Params) -> Option<f64> {
    let prev = match how {
        Fitted::Envelope => envelope(prev),
        Fitted::Steps => steps(prev, step_rise(noise, p)),
        _ => prev.to_vec(),
    };
    let ts: Vec<f64> = prev.iter().map(|x| x.t).collect();
    let ys: Vec<f64> = prev.iter().map(|x| x.rss).collect();
    fit(&ts, &ys).map(|f| f.slope).filter(|s| *s > 0.0)
}

/// Points that set a new high by more than a page: a leak keeps setting them, noise does
/// not.
fn new_highs(ys: &[f64]) -> usize {
    let mut highs = 0usize;
    let mut top = f64::MIN;
    for y in ys {
        if *y > top + 4096.0 {
            highs += 1;
            top = *y;
        }
    }
    highs
}

/// The slope of a fit's later half over its earlier half, 0 at <= 0.3, 1 at >= 0.7 (1 with
/// too few points to say). Halves by count; a staircase's by time: its corners are dense
/// on a smooth climb and one on a long flat level, which is the stop a warm-up ends with.
fn halves_linearity(ts: &[f64], ys: &[f64], how: Fitted) -> f64 {
    let enough = ts.len() >= 6 || (matches!(how, Fitted::Troughs | Fitted::Steps) && ts.len() >= 4);
    if !enough {
        return 1.0;
    }
    let mid = match how {
        Fitted::Steps => {
            let t_mid = (ts[0] + ts[ts.len() - 1]) / 2.0;
            ts.iter().position(|t| *t > t_mid).unwrap_or(ts.len())
        }
        _ => ts.len() / 2,
    };
    match (fit(&ts[..mid], &ys[..mid]), fit(&ts[mid..], &ys[mid..])) {
        (Some(e), Some(l)) if e.slope > 0.0 => ramp(l.slope / e.slope, 0.3, 0.7),
        // A half with a single corner says nothing about the rate.
        (None, _) | (_, None) if how == Fitted::Steps => 0.0,
        _ => 1.0,
    }
}

/// Oscillation: a series that earlier (`history`, up to the window's start) fell by as much
/// as this window grew (a GC sawtooth, freed batches) is cycling, unless it has now climbed
/// well past the peaks of those cycles: 0.3, rising to 1 at 3 cycles beyond. Falls within
/// the noise are jitter, not cycles; a peak from before the series was observed (after an
/// agent restart) counts as an earlier cycle.
fn oscillation(
    history: &[Point],
    now: f64,
    growth: f64,
    noise: f64,
    ctx: &Context,
    p: &Params,
) -> f64 {
    let hist_peak = history.iter().map(|x| x.rss).fold(f64::MIN, f64::max);
    let mut cycle = largest_drop(history);
    if cycle < significant_drop(hist_peak, noise, p) {
        cycle = 0.0;
    }
    let prior_peak = hist_peak.max(ctx.prior_peak);
    if ctx.prior_peak > hist_peak {
        cycle = cycle.max(ctx.prior_peak - history[0].rss);
    }
    if cycle > 0.3 * growth {
        let beyond = (now - prior_peak) / cycle.max(1.0);
        0.3 + 0.7 * ramp(beyond, 1.0, 3.0)
    } else {
        1.0
    }
}

/// The standard error of the fitted slope `f` of `ys` over `ts` (the slope itself when
/// there are too few points to say).
fn slope_standard_error(ts: &[f64], ys: &[f64], f: &Fit) -> f64 {
    let n = ts.len() as f64;
    let mx = ts.iter().sum::<f64>() / n;
    let sxx: f64 = ts.iter().map(|t| (t - mx).powi(2)).sum();
    let ss_res: f64 = ts
        .iter()
        .zip(ys)
        .map(|(t, y)| (y - f.intercept - f.slope * t).powi(2))
        .sum();
    if n > 2.0 && sxx > 0.0 {
        (ss_res / (n - 2.0) / sxx).sqrt()
    } else {
        f.slope
    }
}

/// The recent growth rate of a run and, against `headroom` bytes, when it reaches the
/// limit: the point estimate at the rate of the trend's window (`trend_secs`, the window
/// the confidence was scored on: a leak that began after a flat period is not diluted by
/// it), at most its last minute (lower envelope when the series jitters); and a lower
/// bound at that rate plus two standard errors or at the last 10 s's rate, whichever is
/// faster (a leak that speeds up). None when the run is not growing or is slowing down
/// so that it levels off before the limit.
///
/// The point estimate counts `reclaimable` page cache as room (the kernel reclaims it
/// before it kills); the lower bound does not (it may not be able to: dirty pages, a
/// working set it must keep re-reading).
pub fn time_to_oom(
    run: &[Point],
    trend_secs: f64,
    headroom: f64,
    reclaimable: f64,
) -> (f64, Option<Eta>) {
    let end = run[run.len() - 1].t;
    let span = trend_secs.min(60.0);
    let mut recent: Vec<Point> = run.iter().copied().filter(|x| x.t >= end - span).collect();
    if recent.len() < 3 {
        recent = run[run.len().saturating_sub(3)..].to_vec();
    }
    let pts = if recent.len() >= 36 && noise(&recent) > 0.0 {
        envelope(&recent)
    } else {
        recent.clone()
    };
    let ts: Vec<f64> = pts.iter().map(|x| x.t).collect();
    let ys: Vec<f64> = pts.iter().map(|x| x.rss).collect();
    // A leak that began inside the window (a flat level, then the climb) grows at the
    // climb's rate, not at that of a line through both.
    let k = knee(&ts, &ys).unwrap_or(0);
    let (ts, ys) = (&ts[k..], &ys[k..]);
    let Some(f) = fit(ts, ys) else {
        return (0.0, None);
    };
    if f.slope <= 0.0 {
        return (f.slope, None);
    }
    let se = slope_standard_error(ts, ys, &f);
    let short: Vec<&Point> = run.iter().filter(|x| x.t >= end - 10.0).collect();
    let short_slope = fit(
        &short.iter().map(|x| x.t).collect::<Vec<_>>(),
        &short.iter().map(|x| x.rss).collect::<Vec<_>>(),
    )
    .map_or(0.0, |s| s.slope);
    // Slowing down: the later half of the run's last two minutes grew at r times the
    // earlier half's rate. If it keeps slowing so (a geometric series), what is still to
    // come is late * half * r / (1 - r); when that stays under the headroom, the series
    // levels off first: a warm-up, not an OOM.
    let tail: Vec<Point> = run.iter().copied().filter(|x| x.t >= end - 120.0).collect();
    if tail.len() >= 12 {
        let mid = tail.len() / 2;
        let half = tail[tail.len() - 1].t - tail[mid].t;
        let xs = |v: &[Point]| v.iter().map(|x| x.t).collect::<Vec<_>>();
        let zs = |v: &[Point]| v.iter().map(|x| x.rss).collect::<Vec<_>>();
        if let (Some(e), Some(l)) = (
            fit(&xs(&tail[..mid]), &zs(&tail[..mid])),
            fit(&xs(&tail[mid..]), &zs(&tail[mid..])),
        ) && e.slope > 0.0
        {
            let r = l.slope / e.slope;
            if r < 0.8 && l.slope.max(0.0) * half * r / (1.0 - r).max(1e-9) < headroom + reclaimable
            {
                return (f.slope, None);
            }
        }
    }
    let fast = (f.slope + 2.0 * se).max(short_slope);
    let left = headroom.max(0.0);
    let mut low = left / fast;
    // Growth that speeds up (a JVM expanding its heap faster as it fills, a collector
    // working harder near its limit): the last two minutes' quadratic trend, when it
    // curves upwards, reaches the limit sooner than any straight line.
    if let Some(q) = quadratic_time_to(&tail, left) {
        low = low.min(q);
    }
    (
        f.slope,
        Some(Eta {
            secs: (left + reclaimable.max(0.0)) / f.slope,
            low_secs: low,
        }),
    )
}

/// Where the current growth began in the series `(ts, ys)`, when it began inside it: the
/// split into an earlier and a later stretch, each fitted by its own line, that leaves the
/// least residual, taken when it leaves at most a quarter of a single line's, the later
/// stretch is itself a line (R² >= 0.9) and it climbs at least twice as fast as the
/// earlier one (a flat level, or a slower leak, before it). Otherwise None, and a line
/// through the whole series is the trend: a steady leak, jitter, a staircase (its levels
/// fit flat lines on both sides of a step), a leak that slows down.
///
/// Segmented regression with one breakpoint, searched exhaustively in O(n): every
/// stretch's line and residual come from prefix sums (it runs for every series scored,
/// each report).
fn knee(ts: &[f64], ys: &[f64]) -> Option<usize> {
    let n = ts.len().min(ys.len());
    if n < 5 {
        return None;
    }
    // Sums of t, y, t², t·y, y² over [0, i), on values taken from the first point's: a
    // minute of seconds and the bytes grown in it keep the sums far from f64's limits
    // (monotonic seconds and resident sizes squared would not).
    let mut pre = vec![[0.0f64; 5]; n + 1];
    for i in 0..n {
        let (t, y) = (ts[i] - ts[0], ys[i] - ys[0]);
        let p = pre[i];
        pre[i + 1] = [p[0] + t, p[1] + y, p[2] + t * t, p[3] + t * y, p[4] + y * y];
    }
    // The least-squares line through [a, b): its slope, residual sum of squares and R²
    // (as `fit` defines them).
    let line = |a: usize, b: usize| -> Option<(f64, f64, f64)> {
        let m = (b - a) as f64;
        let d = |j: usize| pre[b][j] - pre[a][j];
        let sxx = d(2) - d(0) * d(0) / m;
        if sxx <= f64::EPSILON {
            return None;
        }
        let sxy = d(3) - d(0) * d(1) / m;
        let syy = d(4) - d(1) * d(1) / m;
        let slope = sxy / sxx;
        let residual = (syy - slope * sxy).max(0.0);
        let r2 = if syy <= f64::EPSILON {
            0.0
        } else {
            (1.0 - residual / syy).clamp(0.0, 1.0)
        };
        Some((slope, residual, r2))
    };
    let (slope, whole, _) = line(0, n)?;
    if slope <= 0.0 {
        return None;
    }
    let mut best: Option<(usize, f64)> = None;
    // An earlier stretch of at least 2 points, a later one of at least 3.
    for k in 2..=n - 3 {
        let (Some((before, a, _)), Some((after, b, after_r2))) = (line(0, k), line(k, n)) else {
            continue;
        };
        if after > 2.0 * before.max(0.0) && after_r2 >= 0.9 && best.is_none_or(|(_, ss)| a + b < ss)
        {
            best = Some((k, a + b));
        }
    }
    best.filter(|&(_, ss)| ss <= 0.25 * whole).map(|(k, _)| k)
}

/// Seconds from the last point until the least-squares parabola through `pts` has grown
/// by `left`, when it curves upwards (None otherwise, or with fewer than 12 points).
fn quadratic_time_to(pts: &[Point], left: f64) -> Option<f64> {
    if pts.len() < 12 {
        return None;
    }
    let end = pts[pts.len() - 1].t;
    let n = pts.len() as f64;
    // Centred on the last point and scaled, so the normal equations stay well conditioned.
    let xs: Vec<f64> = pts.iter().map(|p| (p.t - end) / 60.0).collect();
    let my = pts.iter().map(|p| p.rss).sum::<f64>() / n;
    let ys: Vec<f64> = pts.iter().map(|p| p.rss - my).collect();
    let s = |k: i32| xs.iter().map(|x| x.powi(k)).sum::<f64>();
    let sy = |k: i32| xs.iter().zip(&ys).map(|(x, y)| x.powi(k) * y).sum::<f64>();
    let m = [[n, s(1), s(2)], [s(1), s(2), s(3)], [s(2), s(3), s(4)]];
    let v = [sy(0), sy(1), sy(2)];
    let det = |m: [[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(m);
    if d.abs() < 1e-12 {
        return None;
    }
    let col = |i: usize| {
        let mut c = m;
        for r in 0..3 {
            c[r][i] = v[r];
        }
        det(c) / d
    };
    // y(x) = a + b x + c x², x in minutes from the last point.
    let (b, c) = (col(1), col(2));
    // Curving upwards, and enough to matter over the span fitted (5 % of the line's
    // growth): a straight line's numerical curvature is not acceleration.
    let span = -xs[0];
    if c <= 0.0 || c * span * span < 0.05 * b.abs() * span {
        return None;
    }
    // Growth from now: b x + c x² = left.
    let x = (-b + (b * b + 4.0 * c * left).sqrt()) / (2.0 * c);
    (x > 0.0).then_some(x * 60.0)
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

    /// A process started at 0, evaluated at `now`, without a limit.
    fn at(now: f64) -> Context {
        Context {
            start_t: 0.0,
            now_t: now,
            ..Default::default()
        }
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
            if let Some(v) = assess(&pts, &at(now), &Params::default())
                && v.confidence >= 60
            {
                return Some(now - leak_start);
            }
            now += 1.0;
        }
        None
    }

    /// Highest confidence a pattern reaches over `secs`, evaluated every second.
    fn max_confidence(secs: f64, f: impl Fn(f64) -> (f64, f64) + Copy) -> u8 {
        max_confidence_from(3.0, secs, f)
    }

    /// The same, judged only from `from` on (what came before is still fed).
    fn max_confidence_from(from: f64, secs: f64, f: impl Fn(f64) -> (f64, f64) + Copy) -> u8 {
        let mut worst = 0;
        let mut now = from;
        while now <= secs {
            if let Some(v) = assess(&series(now, f), &at(now), &Params::default()) {
                worst = worst.max(v.confidence);
            }
            now += 1.0;
        }
        worst
    }

    /// Lowest confidence a pattern gets from `from` to `secs`, evaluated every second.
    fn min_confidence_from(from: f64, secs: f64, f: impl Fn(f64) -> (f64, f64) + Copy) -> u8 {
        let mut lowest = 100;
        let mut now = from;
        while now <= secs {
            let c =
                assess(&series(now, f), &at(now), &Params::default()).map_or(0, |v| v.confidence);
            lowest = lowest.min(c);
            now += 1.0;
        }
        lowest
    }

    #[test]
    fn a_staircase_leak_is_kept_and_a_staircase_that_stops_is_not() {
        // A runtime committing 8 MiB every 25 s (335 KB/s), flat in between: fitted point
        // by point it is a flat tail half the time.
        let stairs = |t: f64| {
            let v = 50.0 * MIB + 8.0 * MIB * (t / 25.0).floor();
            (v, v)
        };
        let kept = min_confidence_from(120.0, 400.0, stairs);
        assert!(kept >= 50, "a staircase leak dropped to {kept}");
        assert!(max_confidence_from(3.0, 120.0, stairs) >= 60);
        // The same staircase stopping after its sixth step (150 s): judged 60 s later.
        let stops = move |t: f64| stairs(t.min(150.0));
        let after = max_confidence_from(210.0, 500.0, stops);
        assert!(after < 60, "a staircase that stopped scored {after}");
    }

    #[test]
    fn steps_towards_a_near_limit_are_not_read_as_slowing_down() {
        // Node.js's start, as the corpus's sidecar recorded it (run 5, MiB each second):
        // V8 steps its heap up and pauses between steps; its pod's limit is 160 MiB.
        const CHARGE: [f64; 15] = [
            18.7, 23.1, 28.5, 32.0, 35.0, 47.4, 47.6, 48.5, 51.2, 74.0, 74.2, 74.1, 74.2, 74.2,
            88.5,
        ];
        let pts: Vec<Point> = CHARGE
            .iter()
            .enumerate()
            .map(|(i, m)| Point {
                t: i as f64 + 1.0,
                rss: m * MIB,
                anon: (m - 12.0) * MIB,
            })
            .collect();
        let judge = |n: usize, limit: Option<f64>| {
            let now = n as f64;
            let ctx = Context {
                headroom: limit.map(|l| l - pts[n - 1].rss),
                ..at(now)
            };
            assess(&pts[..n], &ctx, &Params::default()).map_or(0, |v| v.confidence)
        };
        // Against its limit, found by 6 s and kept through the pauses.
        assert!(judge(6, Some(160.0 * MIB)) >= 60);
        for n in 6..=CHARGE.len() {
            let c = judge(n, Some(160.0 * MIB));
            assert!(c >= 50, "dropped to {c} at {n} s");
        }
        // Without a limit nothing is urgent, and the pause after a fast start is what a
        // warm-up's end looks like: the slowing-down check still applies.
        assert!(
            (6..=CHARGE.len()).any(|n| judge(n, None) < 50),
            "the slowing-down check never applied"
        );
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
        // An R² that scores every positive slope the same is no measure of fit: points on a
        // line must score higher than scattered points that also rise.
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
        // From the process's start too: no blind spot (the first 2 s of a process are its
        // start-up, and a trend needs 3 points).
        for (rate, goal) in cases {
            let goal = f64::max(goal, 5.0);
            let got = detection_secs(rate, 0.0, goal * 3.0);
            assert!(
                got.is_some_and(|s| s <= goal),
                "{} B/s from start detected after {got:?} s, goal {goal} s",
                rate
            );
        }
    }

    #[test]
    fn stable_patterns_never_reach_60_once_their_growth_stopped_for_60_s() {
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
        // The corpus's rule (corpus.rs): judged from 60 s after the last new high by more
        // than max(2 MiB, 2 %): a sawtooth's first peak (10 s), the plateau's last such step
        // (about 50 s), the first burst; page cache is never a leak (file-backed).
        for (name, worst) in [
            ("flat", max_confidence(secs, flat)),
            ("sawtooth", max_confidence_from(70.0, secs, sawtooth)),
            ("plateau", max_confidence_from(110.0, secs, plateau)),
            ("bursty", max_confidence_from(60.0, secs, bursty)),
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
    fn an_accelerating_growth_reaches_the_limit_sooner_than_a_line_says() {
        let pts: Vec<Point> = (0..=20)
            .map(|t| {
                let rss = 1000.0 * (t * t) as f64;
                Point {
                    t: t as f64,
                    rss,
                    anon: rss,
                }
            })
            .collect();
        // From t = 20, 500,000 more bytes are reached at t = 30.
        let q = quadratic_time_to(&pts, 500_000.0).expect("curves upwards");
        assert!((q - 10.0).abs() < 1e-6, "{q}");
        let line: Vec<Point> = pts
            .iter()
            .map(|p| Point {
                rss: 1000.0 * p.t,
                ..*p
            })
            .collect();
        assert_eq!(quadratic_time_to(&line, 500_000.0), None);
    }

    #[test]
    fn a_leak_that_starts_after_a_flat_level_is_timed_at_its_own_rate() {
        // 20 MiB held for 20 s, then 2 MiB/s against a 128 MiB limit (the e2e test's leak),
        // starting at any phase of the sampling, with and without 0.3 MiB of jitter. The
        // windows the confidence picks reach back into the flat level now and then: a
        // line through both read 1.30-1.46 MiB/s (a time to OOM 40 % late).
        for phase in [0.0, 0.25, 0.5, 0.75] {
            for jitter in [0.0, 0.3] {
                let f = |t: f64| {
                    let rss = 20.0 * MIB
                        + 2.0 * MIB * (t - 20.0 - phase).max(0.0)
                        + jitter * MIB * (t * 7.3).sin();
                    (rss, rss - 2.0 * MIB)
                };
                for now in 21..=50 {
                    let now = now as f64;
                    let left = 128.0 * MIB - f(now).0;
                    let ctx = Context {
                        headroom: Some(left),
                        ..at(now)
                    };
                    let Some(v) = assess(&series(now, f), &ctx, &Params::default()) else {
                        continue;
                    };
                    if v.confidence < 60 {
                        continue;
                    }
                    let rate = v.slope / MIB;
                    assert!(
                        (1.7..=2.3).contains(&rate),
                        "phase {phase}, jitter {jitter}, at {now} s: {rate:.2} MiB/s"
                    );
                    let eta = v.eta.expect("a time to OOM").secs;
                    let truth = left / (2.0 * MIB);
                    assert!(
                        (eta - truth).abs() <= 0.2 * truth,
                        "phase {phase}, jitter {jitter}, at {now} s: {eta:.0} s to OOM, truly {truth:.0}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_staircase_or_a_steady_leak_has_no_knee() {
        let knee_of = |f: &dyn Fn(f64) -> f64| {
            let ts: Vec<f64> = (0..40).map(f64::from).collect();
            let ys: Vec<f64> = ts.iter().map(|&t| f(t)).collect();
            knee(&ts, &ys)
        };
        // Steps of 8 MiB every 10 s: flat on both sides of each step.
        assert_eq!(
            knee_of(&|t| 50.0 * MIB + 8.0 * MIB * (t / 10.0).floor()),
            None
        );
        // A steady leak with jitter.
        assert_eq!(
            knee_of(&|t| 50.0 * MIB + MIB * t + 0.4 * MIB * (t * 3.1).sin()),
            None
        );
        // A leak that slows down.
        assert_eq!(
            knee_of(&|t| 50.0 * MIB + 4.0 * MIB * t.min(20.0) + MIB * (t - 20.0).max(0.0)),
            None
        );
        // Flat, then a leak from 25 s: the climb starts at its first point above the level.
        assert_eq!(
            knee_of(&|t| 50.0 * MIB + MIB * (t - 25.0).max(0.0)),
            Some(25)
        );
    }

    #[test]
    fn no_time_to_oom_without_growth() {
        let pts = |f: fn(f64) -> f64| -> Vec<Point> {
            (0..20)
                .map(|t| Point {
                    t: t as f64,
                    rss: f(t as f64),
                    anon: f(t as f64),
                })
                .collect()
        };
        assert_eq!(
            time_to_oom(&pts(|_| 5.0 * MIB), 20.0, 100.0 * MIB, 0.0).1,
            None
        );
        assert_eq!(
            time_to_oom(&pts(|t| 50.0 * MIB - t * MIB), 20.0, 100.0 * MIB, 0.0).1,
            None
        );
        // 5 MiB/s with 100 MiB left: 20 s.
        let eta = time_to_oom(&pts(|t| 5.0 * MIB * t), 20.0, 100.0 * MIB, 0.0)
            .1
            .expect("eta");
        assert!(
            (eta.secs - 20.0).abs() < 1e-6 && eta.low_secs <= eta.secs,
            "{eta:?}"
        );
        // 50 MiB of page cache to reclaim first: the kill comes 10 s later, but the lower
        // bound does not count on the reclaim.
        let with_cache = time_to_oom(&pts(|t| 5.0 * MIB * t), 20.0, 100.0 * MIB, 50.0 * MIB)
            .1
            .expect("eta");
        assert!((with_cache.secs - 30.0).abs() < 1e-6, "{with_cache:?}");
        assert_eq!(with_cache.low_secs, eta.low_secs);
    }
}
