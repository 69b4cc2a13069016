//! The search over a small grid, the frontier's plot, and the explanation of slow requests.

mod common;

use common::{costs, one_replica};

use modelmux_cache::EvictionPolicy;
use modelmux_plan::search::{Grid, Targets, cost, search};
use modelmux_plan::{Trace, explain, plot, replay};

/// Ten models asked for round-robin every 50 ms, 20 rounds: only ten slots in all hit.
fn round_robin() -> Trace {
    let lines: String = (0..200)
        .map(|i| format!("{:.3},m{}\n", f64::from(i) * 0.05, i % 10))
        .collect();
    Trace::parse(&lines).unwrap()
}

#[test]
fn the_cheapest_setting_that_meets_the_targets_is_found_and_the_frontier_is_not_dominated() {
    let trace = round_robin();
    let grid = Grid {
        replicas: vec![1, 2, 4],
        max_models: vec![2, 5, 10],
        max_concurrent_loads: vec![1, 2],
        policies: vec![EvictionPolicy::Lru],
    };
    let settings = grid.settings(&one_replica(2));
    assert_eq!(settings.len(), 18);
    assert!(
        settings.windows(2).all(|w| cost(&w[0]) <= cost(&w[1])),
        "cheapest first"
    );
    let targets = Targets {
        p99_ms: Some(150.0),
        min_hit_ratio: Some(0.9),
    };
    let found = search(&trace, &settings, &costs(), &targets, 2, &|_| {}).unwrap();
    let cheapest = &found.reports[found.cheapest.expect("some setting meets the targets")];
    // Ten models need ten slots: 1 x 10 is the cheapest (fewest replicas first); LRU on
    // fewer slots than a round-robin's models never hits.
    assert_eq!(
        (cheapest.setting.replicas, cheapest.setting.max_models),
        (1, Some(10))
    );
    assert!(cheapest.hit_ratio >= 0.9, "{}", cheapest.hit_ratio);
    for r in &found.reports {
        if cost(&r.setting) < cost(&cheapest.setting) {
            assert!(
                !targets.misses(r).is_empty(),
                "a cheaper setting met the targets: {r:?}"
            );
        }
        let slots = r.setting.max_models.unwrap() * r.setting.replicas;
        if slots < 10 {
            assert!(
                r.hit_ratio < 0.9,
                "{slots} slots for a 10-model cycle: {r:?}"
            );
        }
    }
    for &i in &found.frontier {
        let r = &found.reports[i];
        let beaten = found.reports.iter().any(|o| {
            cost(&o.setting) <= cost(&r.setting)
                && o.end_to_end_ms.p99 < r.end_to_end_ms.p99
                && o.hit_ratio > r.hit_ratio
        });
        assert!(!beaten, "{:?} on the frontier is dominated", r.setting);
    }
    assert!(found.frontier.contains(&found.cheapest.unwrap()));
    let table = found.table(&targets);
    assert!(table.contains("**cheapest**"), "{table}");
    // The plot: a PNG of the stated size.
    let png = plot::frontier_png(&found, &targets).unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let reader = decoder.read_info().unwrap();
    assert_eq!((reader.info().width, reader.info().height), (1000, 560));
}

#[test]
fn explain_names_the_load_waited_for_and_the_model_that_evicted_it() {
    // One replica, two slots, LRU: a, b, then c evicts a; a again waits for its load.
    let trace = Trace::parse("0,a\n1,b\n2,c\n3,a\n").unwrap();
    let outcome = replay(&trace, &one_replica(2), &costs(), &|_| {}).unwrap();
    let late = explain::explain(&trace, &outcome, 50.0, 10);
    let last = late
        .iter()
        .find(|l| l.index == 3)
        .expect("the last request was late");
    assert_eq!(last.model, "a");
    let why = last.why.join("\n");
    assert!(why.contains("waited 100.0 ms for the load of 'a'"), "{why}");
    assert!(why.contains("to make room for 'c'"), "{why}");
    let first = late.iter().find(|l| l.index == 0).unwrap();
    assert!(
        first
            .why
            .join("\n")
            .contains("'a' had never been loaded before")
    );
}
