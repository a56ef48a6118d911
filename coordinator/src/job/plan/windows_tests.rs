//! Items into windows, the cap, and the order of a window's task.

use rsembed_schemas::task::{ItemInfo, ItemProj};
use rsembed_schemas::window::Composite;

use super::*;

const DAY: i64 = 86_400_000_000;
/// 2024-01-01T00:00:00Z.
const JAN1: i64 = 1_704_067_200_000_000;

fn spec(max_scenes: u32) -> WindowSpec {
    WindowSpec {
        duration: "P3M".into(),
        composite: Composite::Best,
        max_scenes,
        cell_blocks: true,
    }
}

fn item(id: &str, datetime: Option<i64>, cloud: Option<f64>) -> TaskInput {
    TaskInput {
        uri: format!("https://stac.example/items/{id}"),
        size: 10,
        version: None,
        chips: None,
        parts: vec![],
        item: Some(Box::new(ItemInfo {
            id: id.into(),
            collection: None,
            datetime,
            end_datetime: None,
            cloud_cover: cloud,
            units: vec![],
            mask: None,
            grid: None,
            proj: None,
            error: None,
        })),
    }
}

fn ids(t: &Task) -> Vec<&str> {
    t.inputs
        .iter()
        .map(|i| i.item.as_ref().unwrap().id.as_str())
        .collect()
}

fn plan(max_scenes: u32) -> WindowPlan {
    blocks_of(max_scenes, 16)
}

/// Chips of 256 every 256, blocks of about `cells` cells.
fn blocks_of(max_scenes: u32, cells: usize) -> WindowPlan {
    WindowPlan::new(
        &spec(max_scenes),
        Some("2024-01-01T00:00:00Z/2024-12-31T23:59:59Z"),
        256,
        256,
        cells,
    )
    .unwrap()
}

/// An item on EPSG:32633's 10 m lattice with its corner at lattice pixel
/// (`col0`, `row0`) and `w` × `h` pixels.
fn placed(id: &str, days: i64, cloud: f64, col0: i64, row0: i64, w: u32, h: u32) -> TaskInput {
    let mut i = item(id, Some(JAN1 + days * DAY), Some(cloud));
    let info = i.item.as_mut().unwrap();
    info.grid = Some([w, h]);
    info.proj = Some(ItemProj {
        epsg: 32633,
        transform: [
            col0 as f64 * 10.0,
            10.0,
            0.0,
            -row0 as f64 * 10.0,
            0.0,
            -10.0,
        ],
    });
    i
}

fn blocks(t: &[Task]) -> Vec<(i64, i64, Vec<&str>)> {
    t.iter()
        .map(|t| {
            let b = t.cells.as_ref().expect("a block task");
            assert_eq!(b.lattice, "EPSG:32633/10/256");
            assert_eq!((b.cols, b.rows), (4, 4));
            (b.col, b.row, ids(t))
        })
        .collect()
}

#[test]
fn each_item_goes_to_the_window_holding_its_time() {
    let mut p = plan(64);
    for i in [
        item("feb", Some(JAN1 + 40 * DAY), Some(5.0)),
        item("jan", Some(JAN1 + 3 * DAY), None),
        item("oct", Some(JAN1 + 280 * DAY), Some(1.0)),
        item("apr1", Some(JAN1 + 91 * DAY), Some(0.0)),
    ] {
        assert!(matches!(p.push(i), Placed::Held));
    }
    assert!(matches!(
        p.push(item("2023", Some(JAN1 - DAY), None)),
        Placed::Outside
    ));
    assert!(matches!(
        p.push(item("2025", Some(JAN1 + 366 * DAY), None)),
        Placed::Outside
    ));
    assert!(matches!(p.push(item("none", None, None)), Placed::Outside));
    let mut bad = item("bad", Some(JAN1), None);
    bad.item.as_mut().unwrap().error = Some("no red".into());
    assert!(matches!(p.push(bad), Placed::Error(_)));
    let tasks: Vec<_> = p
        .finish("job")
        .into_iter()
        .map(|(c, t)| {
            assert_eq!(c.tasks, 1, "unplaced items: one task a window");
            (t.into_iter().next().unwrap(), c)
        })
        .collect();
    let got: Vec<_> = tasks.iter().map(|(t, c)| (c.index, ids(t))).collect();
    // Q1 (by time), Q2 (April 1st is its first day), Q4; Q3 has no task.
    assert_eq!(
        got,
        [(0, vec!["jan", "feb"]), (1, vec!["apr1"]), (3, vec!["oct"])]
    );
    let (t, c) = &tasks[1];
    assert_eq!(t.window.unwrap().start, JAN1 + 91 * DAY);
    assert_eq!(
        (c.start, c.end),
        (t.window.unwrap().start, t.window.unwrap().end)
    );
    assert_eq!(c.dropped, 0);
}

#[test]
fn a_full_window_drops_the_cloudiest_then_the_earliest_whatever_the_order() {
    let items = [
        item("clear-early", Some(JAN1 + DAY), Some(1.0)),
        item("cloudy", Some(JAN1 + 5 * DAY), Some(90.0)),
        item("clear-late", Some(JAN1 + 9 * DAY), Some(1.0)),
        item("unknown", Some(JAN1 + 2 * DAY), None),
        item("hazy", Some(JAN1 + 20 * DAY), Some(30.0)),
    ];
    let mut orders = vec![items.to_vec()];
    orders.push(items.iter().rev().cloned().collect());
    let mut seen = vec![];
    for order in orders {
        let mut p = plan(3);
        for i in order {
            p.push(i);
        }
        let tasks = p.finish("job");
        let [(c, t)] = &tasks[..] else {
            panic!("one window")
        };
        let [t] = &t[..] else { panic!("one task") };
        assert_eq!(c.dropped, 2);
        assert_eq!(c.acquisitions, 3);
        seen.push((t.task_id.clone(), ids(t).join(",")));
    }
    // No cover counts as clear; of the two 1 % ones the later is kept over
    // the 30 % one, which goes with the 90 % one.
    assert_eq!(seen[0].1, "clear-early,unknown,clear-late");
    assert_eq!(
        seen[0], seen[1],
        "the plan does not depend on the listing's order"
    );
}

#[test]
fn windows_need_the_interval() {
    assert!(WindowPlan::new(&spec(64), None, 256, 256, 16).is_err());
    assert!(WindowPlan::new(&spec(64), Some("2024-01-01T00:00:00Z/.."), 256, 256, 16).is_err());
}

#[test]
fn placed_acquisitions_go_to_every_block_they_overlap() {
    // Blocks of 4 x 4 cells of 256 pixels: 1024 lattice pixels a side.
    let mut p = blocks_of(64, 16);
    // Cells 0..=3 x 0..=3: block (0, 0) only.
    p.push(placed("a", 1, 0.0, 0, 0, 1024, 1024));
    // Starts one pixel into cell 3 and ends in cell 4: blocks (0, 0) and (1, 0).
    p.push(placed("b", 2, 0.0, 769, 0, 500, 10));
    // West of and north of the origin: cells -1 and row -1, block (-1, -1).
    p.push(placed("c", 3, 0.0, -10, -10, 10, 10));
    // Another quarter: its own block task.
    p.push(placed("d", 100, 0.0, 0, 0, 10, 10));
    let w = p.finish("job");
    assert_eq!(w.len(), 2);
    let (c, t) = &w[0];
    assert_eq!(
        blocks(t),
        [
            (-4, -4, vec!["c"]),
            (0, 0, vec!["a", "b"]),
            (4, 0, vec!["b"])
        ]
    );
    assert_eq!((c.tasks, c.acquisitions, c.dropped), (3, 3, 0));
    assert_eq!(blocks(&w[1].1), [(0, 0, vec!["d"])]);
    // Each block is its own task, named by its block.
    let ids: std::collections::HashSet<_> = t.iter().map(|t| &t.task_id).collect();
    assert_eq!(ids.len(), 3);
}

#[test]
fn the_cap_is_per_block_and_one_unplaced_acquisition_keeps_the_window_whole() {
    let mut p = blocks_of(1, 16);
    p.push(placed("west-clear", 1, 1.0, 0, 0, 10, 10));
    p.push(placed("west-cloudy", 2, 50.0, 0, 0, 10, 10));
    p.push(placed("east", 3, 90.0, 2048, 0, 10, 10));
    let w = p.finish("job");
    let (c, t) = &w[0];
    // The cloudy east scene is the best of its own block: kept there.
    assert_eq!(
        blocks(t),
        [(0, 0, vec!["west-clear"]), (8, 0, vec!["east"])]
    );
    assert_eq!((c.tasks, c.acquisitions, c.dropped), (2, 2, 1));

    let mut p = blocks_of(2, 16);
    p.push(placed("west-clear", 1, 1.0, 0, 0, 10, 10));
    p.push(placed("west-cloudy", 2, 50.0, 0, 0, 10, 10));
    p.push(placed("east", 3, 90.0, 2048, 0, 10, 10));
    // No projection metadata: the planner cannot say which cells it has.
    p.push(item("unplaced", Some(JAN1 + 4 * DAY), Some(0.0)));
    // Off the lattice by half a pixel: the worker will say so; the window
    // stays whole so nothing of it is cut twice or lost.
    let w = p.finish("job");
    let (c, t) = &w[0];
    let [t] = &t[..] else {
        panic!("one task: {t:?}")
    };
    assert!(t.cells.is_none());
    assert_eq!(ids(t), ["west-clear", "unplaced"]);
    assert_eq!((c.tasks, c.acquisitions, c.dropped), (1, 2, 2));
    // Its id is what a whole-window task's always was.
    let whole = Task::in_window("job", t.window.unwrap(), None, t.inputs.clone());
    assert_eq!(whole.task_id, t.task_id);

    let mut p = blocks_of(64, 16);
    let mut off = placed("off", 1, 0.0, 0, 0, 10, 10);
    off.item.as_mut().unwrap().proj.as_mut().unwrap().transform[0] += 5.0;
    p.push(off);
    p.push(placed("on", 2, 0.0, 0, 0, 10, 10));
    let w = p.finish("job");
    assert!(
        w[0].1[0].cells.is_none(),
        "a half-pixel phase keeps the window whole"
    );
}

#[test]
fn a_job_that_recorded_no_split_keeps_whole_windows() {
    let mut s = spec(64);
    s.cell_blocks = false;
    let mut p = WindowPlan::new(
        &s,
        Some("2024-01-01T00:00:00Z/2024-12-31T23:59:59Z"),
        256,
        256,
        16,
    )
    .unwrap();
    p.push(placed("a", 1, 0.0, 0, 0, 10, 10));
    p.push(placed("b", 2, 0.0, 4096, 0, 10, 10));
    let w = p.finish("job");
    let [t] = &w[0].1[..] else { panic!("one task") };
    assert!(t.cells.is_none());
    assert_eq!(ids(t), ["a", "b"]);
}
