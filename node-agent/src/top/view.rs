//! The interactive `top` screen, drawn with ratatui: one table per section of the frame
//! (CPU, memory, exact targets, allocations, leaks). The focused table (Tab / Shift-Tab)
//! scrolls with ↑ ↓ PgUp PgDn Home End and sorts by any column (`s` cycles the column,
//! `r` reverses); `q`, Esc or Ctrl-C quits. The selection and sort survive refreshes.

use std::time::Duration;

use ratatui::{
    Frame as Screen,
    crossterm::event::{KeyCode, KeyEvent, KeyModifiers},
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Row, Table, TableState},
};
use resourcewatch_units::{format_bytes, format_duration};

use crate::snapshot::{AllocationRow, Attribution, CpuRow, Frame, LeakRow, MemoryRow, TargetRow};

/// How a cell sorts: numbers as numbers (a missing value last), text as text.
#[derive(Clone, Debug, PartialEq, PartialOrd)]
enum Key {
    Num(f64),
    Text(String),
}

struct Column {
    name: &'static str,
    width: Constraint,
}

const fn col(name: &'static str, width: u16) -> Column {
    Column {
        name,
        width: Constraint::Min(width),
    }
}

/// A column that never widens: the leaks table gives its spare width to the growth site.
const fn fixed(name: &'static str, width: u16) -> Column {
    Column {
        name,
        width: Constraint::Length(width),
    }
}

/// One table of the screen, built from a frame.
struct Section {
    title: &'static str,
    columns: &'static [Column],
    /// The column the frame is ranked by: the initial sort.
    ranked_by: usize,
    /// Ranked descending (Top-K) or ascending (soonest OOM first).
    descending: bool,
    rows: Vec<Vec<(String, Key)>>,
}

const CPU: &[Column] = &[
    col("PID", 7),
    col("CPU%", 6),
    col("COMMAND", 16),
    col("CONTAINER", 12),
    col("POD", 36),
];
const MEMORY: &[Column] = &[
    col("PID", 7),
    col("RSS", 10),
    col("COMMAND", 16),
    col("CONTAINER", 12),
    col("POD", 36),
];
const TARGETS: &[Column] = &[
    col("PID", 7),
    col("CPU%", 6),
    col("RSS", 10),
    col("ANON", 10),
    col("FILE", 10),
    col("COMMAND", 16),
];
const ALLOCATIONS: &[Column] = &[
    col("PID", 7),
    col("OUTSTANDING", 11),
    col("ALLOCS", 10),
    col("FREES", 10),
    col("COMMAND", 16),
];
const LEAKS: &[Column] = &[
    fixed("PID", 7),
    fixed("CONF", 4),
    fixed("GROWTH/s", 10),
    fixed("RSS", 10),
    fixed("LIMIT", 10),
    fixed("OOM IN", 8),
    fixed("COMMAND", 16),
    // The heaviest growth site, leaf first (snapshot/sites.rs): the rest of the width.
    Column {
        name: "GROWS AT",
        width: Constraint::Fill(1),
    },
];

fn num(text: String, v: f64) -> (String, Key) {
    (text, Key::Num(v))
}

fn text(s: String) -> (String, Key) {
    let k = Key::Text(s.clone());
    (s, k)
}

fn bytes(b: u64) -> (String, Key) {
    num(format_bytes(b), b as f64)
}

fn comm(who: &Attribution) -> (String, Key) {
    text(who.comm.clone().unwrap_or_else(|| "<exited>".into()))
}

fn short(id: &Option<String>, n: usize) -> (String, Key) {
    text(
        id.as_deref()
            .map(|v| v.chars().take(n).collect())
            .unwrap_or_else(|| "-".into()),
    )
}

fn sections(f: &Frame) -> Vec<Section> {
    let section = |title, columns, ranked_by, descending, rows| Section {
        title,
        columns,
        ranked_by,
        descending,
        rows,
    };
    vec![
        section("CPU", CPU, 1, true, f.cpu.iter().map(cpu_cells).collect()),
        section(
            "MEMORY",
            MEMORY,
            1,
            true,
            f.memory.iter().map(memory_cells).collect(),
        ),
        section(
            "TARGETS (exact)",
            TARGETS,
            2,
            true,
            f.targets.iter().map(target_cells).collect(),
        ),
        section(
            "ALLOCATIONS (libc uprobes)",
            ALLOCATIONS,
            1,
            true,
            f.allocations.iter().map(allocation_cells).collect(),
        ),
        section(
            "LEAKS",
            LEAKS,
            5,
            false,
            f.leaks.iter().map(leak_cells).collect(),
        ),
    ]
}

fn pid(p: u32) -> (String, Key) {
    num(p.to_string(), f64::from(p))
}

fn cpu_cells(r: &CpuRow) -> Vec<(String, Key)> {
    vec![
        pid(r.pid),
        num(format!("{:.1}", r.cpu_percent), r.cpu_percent),
        comm(&r.who),
        short(&r.who.container_id, 12),
        short(&r.who.pod_uid, 36),
    ]
}

fn memory_cells(r: &MemoryRow) -> Vec<(String, Key)> {
    vec![
        pid(r.pid),
        bytes(r.rss_bytes),
        comm(&r.who),
        short(&r.who.container_id, 12),
        short(&r.who.pod_uid, 36),
    ]
}

fn target_cells(r: &TargetRow) -> Vec<(String, Key)> {
    let mut name = comm(&r.who);
    if r.exited {
        name.0.push_str(" (exited)");
    }
    vec![
        pid(r.pid),
        num(format!("{:.1}", r.cpu_percent), r.cpu_percent),
        bytes(r.rss_bytes),
        bytes(r.anon_bytes),
        bytes(r.file_bytes),
        name,
    ]
}

fn allocation_cells(r: &AllocationRow) -> Vec<(String, Key)> {
    vec![
        pid(r.pid),
        bytes(r.outstanding_bytes.max(0) as u64),
        num(r.allocs.to_string(), r.allocs as f64),
        num(r.frees.to_string(), r.frees as f64),
        comm(&r.who),
    ]
}

fn leak_cells(r: &LeakRow) -> Vec<(String, Key)> {
    let mut who = r.who.comm.clone().or(r.who.cgroup.clone());
    if r.basis == crate::leak::Basis::JvmHeap {
        // Growth is the retained heap's, not the resident size's.
        who = who.map(|w| format!("{w} (JVM heap)"));
    }
    let none = || num("none".into(), f64::INFINITY);
    vec![
        match r.pid {
            Some(p) => pid(p),
            None => num("cgroup".into(), f64::INFINITY),
        },
        num(r.confidence.to_string(), f64::from(r.confidence)),
        bytes(r.growth_bytes_per_sec.max(0.0) as u64),
        bytes(r.rss_bytes),
        r.limit_bytes.map_or_else(none, bytes),
        r.time_to_oom_secs.map_or_else(none, |t| {
            num(format_duration(Duration::from_secs_f64(t.max(0.0))), t)
        }),
        text(who.unwrap_or_else(|| "<exited>".into())),
        text(growth_site(r)),
    ]
}

/// The heaviest growth site of a leak, leaf first: "leak_here < keep < grow (81%)".
fn growth_site(r: &LeakRow) -> String {
    match r.growth_sites.first() {
        Some(site) => format!("{} ({:.0}%)", site.frames.join(" < "), site.percent),
        None if r.confidence >= crate::snapshot::sites::SITE_CONFIDENCE && r.pid.is_some() => {
            "capturing...".into()
        }
        None => String::new(),
    }
}

/// Per-section state kept across refreshes.
#[derive(Clone, Debug, Default)]
struct SectionState {
    /// None: the frame's own ranking.
    sort: Option<(usize, bool)>,
    table: TableState,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    Quit,
    Redraw,
    Nothing,
}

#[derive(Debug)]
pub struct View {
    focus: usize,
    state: Vec<SectionState>,
    k: usize,
}

impl View {
    pub fn new(k: usize) -> Self {
        Self {
            focus: 0,
            state: vec![SectionState::default(); 5],
            k,
        }
    }

    pub fn handle(&mut self, key: KeyEvent, frame: Option<&Frame>) -> Action {
        let ctrl_c =
            key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl_c || matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) {
            return Action::Quit;
        }
        // Sections with rows are the ones focus moves between.
        let present: Vec<usize> = match frame {
            Some(f) => sections(f)
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.rows.is_empty())
                .map(|(i, _)| i)
                .collect(),
            None => vec![0],
        };
        let rows = frame.map_or(0, |f| sections(f)[self.focus].rows.len());
        let st = &mut self.state[self.focus];
        match key.code {
            KeyCode::Tab | KeyCode::BackTab if !present.is_empty() => {
                let at = present.iter().position(|&i| i == self.focus).unwrap_or(0);
                let n = present.len();
                let next = if key.code == KeyCode::Tab {
                    at + 1
                } else {
                    at + n - 1
                };
                self.focus = present[next % n];
            }
            KeyCode::Down | KeyCode::Char('j') => st.table.select_next(),
            KeyCode::Up | KeyCode::Char('k') => st.table.select_previous(),
            KeyCode::PageDown => st.table.scroll_down_by(10),
            KeyCode::PageUp => st.table.scroll_up_by(10),
            KeyCode::Home | KeyCode::Char('g') => st.table.select_first(),
            KeyCode::End | KeyCode::Char('G') => st.table.select(rows.checked_sub(1)),
            KeyCode::Char('s') => {
                let columns = sections_columns(self.focus);
                let (c, desc) = st.sort.unwrap_or((usize::MAX, true));
                let next = if c == usize::MAX {
                    0
                } else {
                    (c + 1) % columns
                };
                st.sort = Some((next, desc));
            }
            KeyCode::Char('r') => {
                let s = frame.map(|f| sections(f).swap_remove(self.focus));
                let (c, desc) = st
                    .sort
                    .or(s.map(|s| (s.ranked_by, s.descending)))
                    .unwrap_or((0, true));
                st.sort = Some((c, !desc));
            }
            _ => return Action::Nothing,
        }
        Action::Redraw
    }

    /// Draws `frame` (None: waiting for the first interval).
    pub fn draw(&mut self, screen: &mut Screen, frame: Option<&Frame>) {
        let Some(f) = frame else {
            screen.render_widget(
                Line::from("resourcewatch top — waiting for the first interval…   q to quit"),
                screen.area(),
            );
            return;
        };
        let mut all = sections(f);
        // Empty optional sections take no room; CPU and memory always show.
        let shown: Vec<usize> = (0..all.len())
            .filter(|&i| i < 2 || !all[i].rows.is_empty())
            .collect();
        let constraints: Vec<Constraint> = std::iter::once(Constraint::Length(1))
            .chain(shown.iter().map(|&i| {
                if i < 2 {
                    Constraint::Fill(1)
                } else {
                    Constraint::Length((all[i].rows.len() as u16 + 3).min(12))
                }
            }))
            .collect();
        let areas = Layout::vertical(constraints).split(screen.area());
        let title = format!(
            "resourcewatch top — interval {:.3}s, top {}; kernel samples {} (lost {})   Tab focus, ↑↓ PgUp PgDn scroll, s sort, r reverse, q quit",
            f.interval_ns as f64 / 1e9,
            self.k,
            f.kernel.samples,
            f.kernel.samples_lost
        );
        screen.render_widget(
            Line::from(title).style(Style::default().add_modifier(Modifier::BOLD)),
            areas[0],
        );
        for (slot, &i) in shown.iter().enumerate() {
            let section = &mut all[i];
            let st = &mut self.state[i];
            let (sort_col, desc) = st.sort.unwrap_or((section.ranked_by, section.descending));
            if st.sort.is_some() {
                section.rows.sort_by(|a, b| {
                    let o = a[sort_col]
                        .1
                        .partial_cmp(&b[sort_col].1)
                        .unwrap_or(std::cmp::Ordering::Equal);
                    if desc { o.reverse() } else { o }
                });
            }
            let header = Row::new(section.columns.iter().enumerate().map(|(c, col)| {
                if c == sort_col {
                    format!("{}{}", col.name, if desc { "▼" } else { "▲" })
                } else {
                    col.name.to_string()
                }
            }))
            .style(Style::default().add_modifier(Modifier::BOLD));
            let rows = section
                .rows
                .iter()
                .map(|r| Row::new(r.iter().map(|(t, _)| t.clone())));
            let focused = i == self.focus;
            let block = Block::default()
                .borders(Borders::TOP)
                .title(format!("{} ({})", section.title, section.rows.len()))
                .border_style(if focused {
                    Style::default().add_modifier(Modifier::BOLD)
                } else {
                    Style::default().add_modifier(Modifier::DIM)
                });
            let table = Table::new(rows, section.columns.iter().map(|c| c.width))
                .header(header)
                .block(block)
                .row_highlight_style(if focused {
                    Style::default().add_modifier(Modifier::REVERSED)
                } else {
                    Style::default()
                });
            screen.render_stateful_widget(table, areas[slot + 1], &mut st.table);
        }
    }
}

fn sections_columns(i: usize) -> usize {
    [CPU, MEMORY, TARGETS, ALLOCATIONS, LEAKS][i].len()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::{
        pipelines::KernelStats,
        snapshot::{CpuRow, MemoryRow},
    };
    use ratatui::{Terminal, backend::TestBackend};

    fn who(comm: &str) -> std::sync::Arc<Attribution> {
        std::sync::Arc::new(Attribution::comm(comm))
    }

    fn frame() -> Frame {
        Frame {
            ts_ns: 0,
            interval_ns: 2_000_000_000,
            cpu: (0..30)
                .map(|i| CpuRow {
                    pid: 100 + i,
                    cpu_ns: 0,
                    cpu_percent: 90.0 - f64::from(i),
                    who: who(&format!("burn{i}")),
                })
                .collect(),
            memory: vec![
                MemoryRow {
                    pid: 7,
                    rss_bytes: 300 << 20,
                    who: who("java"),
                },
                MemoryRow {
                    pid: 3,
                    rss_bytes: 200 << 20,
                    who: who("python3"),
                },
                MemoryRow {
                    pid: 9,
                    rss_bytes: 100 << 20,
                    who: who("node"),
                },
            ],
            targets: vec![],
            allocations: vec![],
            leaks: vec![],
            oom_kills: vec![],
            kernel: KernelStats::default(),
        }
    }

    fn screen(view: &mut View, f: &Frame) -> String {
        let mut term = Terminal::new(TestBackend::new(110, 40)).unwrap();
        term.draw(|s| view.draw(s, Some(f))).unwrap();
        let buf = term.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    /// The order in which the commands of `names` appear on the screen.
    fn order(text: &str, names: &[&str]) -> Vec<String> {
        let mut at: Vec<(usize, &str)> = names
            .iter()
            .filter_map(|n| text.find(&format!(" {n} ")).map(|i| (i, *n)))
            .collect();
        at.sort();
        at.into_iter().map(|(_, n)| n.to_string()).collect()
    }

    #[test]
    fn a_leak_shows_where_it_grows() {
        let mut f = frame();
        f.leaks = vec![LeakRow {
            pid: Some(42),
            rss_bytes: 100 << 20,
            growth_bytes_per_sec: 6.4e6,
            r2: 0.99,
            confidence: 100,
            limit_bytes: None,
            time_to_oom_secs: None,
            time_to_oom_low_secs: None,
            growing_secs: 20.0,
            basis: Default::default(),
            growth_sites: vec![crate::snapshot::sites::GrowthSite {
                frames: vec!["leak_here".into(), "keep".into(), "grow".into()],
                bytes: 30 << 20,
                percent: 91.2,
            }],
            who: who("leak-c"),
        }];
        let text = screen(&mut View::new(30), &f);
        assert!(text.contains("GROWS AT"), "{text}");
        assert!(text.contains("leak_here < keep < grow (91%)"), "{text}");
    }

    #[test]
    fn sections_show_ranked_and_sort_on_request() {
        let f = frame();
        let mut v = View::new(30);
        let text = screen(&mut v, &f);
        assert!(
            text.contains("CPU (30)") && text.contains("MEMORY (3)"),
            "{text}"
        );
        assert!(
            text.contains("CPU%▼"),
            "the ranked column is marked: {text}"
        );
        assert_eq!(
            order(&text, &["java", "python3", "node"]),
            ["java", "python3", "node"]
        );
        // Focus memory, sort by PID (s cycles from the first column), then reverse.
        assert_eq!(v.handle(key(KeyCode::Tab), Some(&f)), Action::Redraw);
        v.handle(key(KeyCode::Char('s')), Some(&f));
        let text = screen(&mut v, &f);
        assert!(text.contains("PID▼"), "{text}");
        assert_eq!(
            order(&text, &["java", "python3", "node"]),
            ["node", "java", "python3"]
        );
        v.handle(key(KeyCode::Char('r')), Some(&f));
        let text = screen(&mut v, &f);
        assert_eq!(
            order(&text, &["java", "python3", "node"]),
            ["python3", "java", "node"]
        );
    }

    #[test]
    fn the_focused_table_scrolls_past_the_screen() {
        let f = frame();
        let mut v = View::new(30);
        let text = screen(&mut v, &f);
        assert!(
            !text.contains("burn29"),
            "30 rows do not fit half of 40 lines"
        );
        v.handle(key(KeyCode::End), Some(&f));
        let text = screen(&mut v, &f);
        assert!(
            text.contains("burn29"),
            "End scrolls to the last row: {text}"
        );
        v.handle(key(KeyCode::Home), Some(&f));
        assert!(screen(&mut v, &f).contains("burn0 "));
    }

    #[test]
    fn q_escape_and_ctrl_c_quit() {
        let mut v = View::new(10);
        for k in [
            key(KeyCode::Char('q')),
            key(KeyCode::Esc),
            KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL),
        ] {
            assert_eq!(v.handle(k, None), Action::Quit);
        }
        assert_eq!(v.handle(key(KeyCode::Char('x')), None), Action::Nothing);
    }
}
