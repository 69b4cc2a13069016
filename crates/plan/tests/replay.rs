//! The replay of small hand-made traces, against figures worked out by hand.

mod common;

use common::{costs, one_replica};
use std::time::Duration;

use modelmux_plan::{Report, Trace, replay};

#[test]
fn lru_on_one_replica_gives_the_hits_loads_and_waits_worked_out_by_hand() {
    // Two slots, loads of 100 ms, requests of 10 ms:
    //   0.00 a  miss, loads a            (waits 100, ends at 0.11)
    //   1.00 b  miss, loads b            (waits 100)
    //   2.00 a  hit                      (waits 0)
    //   3.00 c  miss, evicts b (a used at 2.00), loads c
    //   4.00 b  miss, evicts a (used at 2.00; c at 3.00), loads b
    //   4.05 b  miss: joins b's load     (waits 50)
    //   5.00 a  miss, evicts c (used at 3.00; b at 4.05), loads a
    let trace = Trace::parse("0,a\n1,b\n2,a\n3,c\n4,b\n4.05,b\n5,a\n").unwrap();
    let setting = one_replica(2);
    let outcome = replay(&trace, &setting, &costs(), &|_| {}).unwrap();
    let hits: Vec<bool> = outcome.served.iter().map(|s| s.hit).collect();
    assert_eq!(hits, [false, false, true, false, false, false, false]);
    let ms = |d: Duration| (d.as_secs_f64() * 1e3).round() as u64;
    let load_waits: Vec<u64> = outcome
        .served
        .iter()
        .map(|s| ms(s.ready - s.started))
        .collect();
    assert_eq!(load_waits, [100, 100, 0, 100, 100, 50, 100]);
    let ends: Vec<u64> = outcome.served.iter().map(|s| ms(s.ended)).collect();
    assert_eq!(ends, [110, 1110, 2010, 3110, 4110, 4110, 5110]);
    assert_eq!(outcome.loads, 5);
    let report = Report::new(&trace, &setting, &outcome);
    assert_eq!(report.hit_ratio, 1.0 / 7.0);
    // Belady with 2 slots: at c, evict a (next at 5.00) rather than b (next at 4.00): the
    // two b's hit, a misses at the end: 3 hits.
    assert_eq!(report.belady_hit_ratio, 3.0 / 7.0);
    assert_eq!(report.refused, 0);
    assert_eq!(report.queue_ms.max, 0.0);
    assert_eq!(report.end_to_end_ms.p50, 110.0);
    assert_eq!(report.end_to_end_ms.max, 110.0);
    assert!(
        (report.loads_per_s - 1.0).abs() < 1e-9,
        "{}",
        report.loads_per_s
    );
}

#[test]
fn one_load_slot_makes_the_second_model_wait_for_the_first_load() {
    // Both at 0: b's load waits for a's to end (one slot), so b waits 200 ms.
    let trace = Trace::parse("0,a\n0,b\n").unwrap();
    let outcome = replay(&trace, &one_replica(4), &costs(), &|_| {}).unwrap();
    let waits: Vec<Duration> = outcome.served.iter().map(|s| s.ready - s.started).collect();
    let mut sorted = waits.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        [Duration::from_millis(100), Duration::from_millis(200)]
    );
    let mut two = one_replica(4);
    two.max_concurrent_loads = 2;
    let outcome = replay(&trace, &two, &costs(), &|_| {}).unwrap();
    assert!(
        outcome
            .served
            .iter()
            .all(|s| s.ready - s.started == Duration::from_millis(100)),
        "two slots load both at once"
    );
}

#[test]
fn a_day_of_trace_replays_in_virtual_time() {
    // One request a minute for a day, over 30 models on 2 replicas: 1,440 requests, 24 h of
    // virtual time (in real time the test would never end).
    let lines: String = (0..1440)
        .map(|i| format!("{},m{}\n", i * 60, (i * 7) % 30))
        .collect();
    let trace = Trace::parse(&lines).unwrap();
    let mut setting = one_replica(8);
    setting.replicas = 2;
    let outcome = replay(&trace, &setting, &costs(), &|_| {}).unwrap();
    assert!(outcome.span >= Duration::from_secs(1439 * 60));
    assert!(outcome.served.iter().all(|s| s.ok));
    let arrivals: Vec<Duration> = outcome.served.iter().map(|s| s.arrived).collect();
    let expected: Vec<Duration> = (0..1440).map(|i| Duration::from_secs(i * 60)).collect();
    assert_eq!(arrivals, expected, "each request sent at its time");
}
