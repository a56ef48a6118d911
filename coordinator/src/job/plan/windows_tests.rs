//! Items into windows, the cap, and the order of a window's task.

use rsembed_schemas::task::ItemInfo;
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
    WindowPlan::new(
        &spec(max_scenes),
        Some("2024-01-01T00:00:00Z/2024-12-31T23:59:59Z"),
    )
    .unwrap()
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
    let tasks = p.finish("job");
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
        let [(t, c)] = &tasks[..] else {
            panic!("one window")
        };
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
    assert!(WindowPlan::new(&spec(64), None).is_err());
    assert!(WindowPlan::new(&spec(64), Some("2024-01-01T00:00:00Z/..")).is_err());
}
