//! Ray's own cases for its default policy, ported with their numbers: each names its source,
//! a test of `python/ray/serve/tests/unit/test_autoscaling_policy.py` (Ray 2.60's behaviour,
//! checked against the 2.60.0 wheel by running its policy) or an example of Ray's docs. Load
//! is written (running, target, requests), as Ray's tests write their context.

use std::time::Duration;

use tokio::time::Instant;

use super::*;

fn config(min: usize, max: usize, target: f64) -> AutoscalingConfig {
    AutoscalingConfig {
        min_replicas: min,
        max_replicas: max,
        target_ongoing_requests: target,
        upscale_delay: Duration::ZERO,
        downscale_delay: Duration::ZERO,
        ..AutoscalingConfig::default()
    }
}

fn load(running: usize, target: usize, requests: f64) -> Load {
    Load {
        running,
        target,
        requests,
        for_loads: 0,
    }
}

/// One decision with no wish carried over.
fn once(c: &AutoscalingConfig, running: usize, target: usize, requests: f64) -> usize {
    Decider::default().decide(c, load(running, target, requests), Instant::now())
}

#[test]
fn single_replica_receives_all_requests() {
    // TestReplicaQueueLengthPolicy::test_single_replica_receives_all_requests
    let c = config(1, 50, 5.0);
    assert_eq!(once(&c, 4, 4, 20.0), 4);
    assert_eq!(once(&c, 4, 4, 100.0), 20);
    assert_eq!(once(&c, 4, 4, 10.0), 2);
}

#[test]
fn replicas_delayed_startup() {
    // ::test_replicas_delayed_startup: replicas still starting (running below target) do
    // not make the policy ask again for what it asked for.
    let mut c = config(1, 200, 1.0);
    c.downscale_delay = Duration::from_secs(100_000);
    let mut d = Decider::default();
    let now = Instant::now();
    assert_eq!(d.decide(&c, load(1, 1, 100.0), now), 100);
    assert_eq!(d.decide(&c, load(1, 100, 100.0), now), 100);
    assert_eq!(d.decide(&c, load(3, 100, 123.0), now), 123);
    assert_eq!(
        d.decide(&c, load(4, 123, 10.0), now),
        123,
        "the downscale delay holds"
    );
}

#[test]
fn scaling_factor_scale_up_from_0_replicas() {
    // ::test_scaling_factor_scale_up_from_0_replicas (the policy says 10; max_replicas 2).
    let mut c = config(0, 2, 2.0);
    c.upscaling_factor = 10.0;
    assert_eq!(once(&c, 0, 0, 1.0), 2);
    c.upscaling_factor = 0.5;
    assert_eq!(once(&c, 0, 0, 1.0), 1);
    // However many wait: one start (a run of the 2.60 wheel: 50 requests give 1).
    assert_eq!(once(&config(0, 10, 2.0), 0, 0, 50.0), 1);
}

#[test]
fn scaling_factor_scale_down_to_0_replicas() {
    // ::test_scaling_factor_scale_down_to_0_replicas
    let mut c = config(0, 5, 2.0);
    c.downscaling_factor = 10.0;
    assert_eq!(once(&c, 5, 5, 0.0), 1, "down to one first");
    assert_eq!(once(&c, 1, 1, 0.0), 0, "then to none");
    c.downscaling_factor = 0.2;
    let mut steps = Vec::new();
    let mut n = 5;
    while n > 0 {
        n = once(&c, n, n, 0.0);
        steps.push(n);
    }
    assert_eq!(steps, [4, 3, 2, 1, 0]);
}

#[test]
fn fluctuating_ongoing_requests() {
    // ::test_fluctuating_ongoing_requests: without delays the count follows each swing; with
    // 30 s delays and ticks 0.1 s apart it never moves.
    for delay in [0, 30] {
        let mut c = config(1, 10, 50.0);
        c.upscale_delay = Duration::from_secs(delay);
        c.downscale_delay = Duration::from_secs(delay);
        let mut d = Decider::default();
        let start = Instant::now();
        let mut target = 1;
        for trial in 0..1000u32 {
            let now = start + Duration::from_millis(100) * trial;
            let (running, requests) = if trial % 2 == 0 {
                (1, 100.0)
            } else {
                (2, 40.0)
            };
            target = d.decide(&c, load(running, target, requests), now);
            let expected = match (delay, trial % 2) {
                (0, 0) => 2,
                (0, _) => 1,
                _ => 1,
            };
            assert_eq!(target, expected, "delay {delay}, trial {trial}");
        }
    }
}

#[test]
fn upscale_downscale_delay() {
    // ::test_upscale_downscale_delay, with and without downscale_to_zero_delay (300 s): up
    // after 30 s of wanting to, down to one after 600 s, to none after 600 (or 300) more; a
    // tick that wants otherwise restarts the wait. Ticks are 0.1 s apart, as Ray's loop.
    for to_zero in [None, Some(300)] {
        let mut c = config(0, 2, 1.0);
        c.upscale_delay = Duration::from_secs(30);
        c.downscale_delay = Duration::from_secs(600);
        c.downscale_to_zero_delay = to_zero.map(Duration::from_secs);
        let mut d = Decider::default();
        let start = Instant::now();
        let tick = |k: u32| start + Duration::from_millis(100) * k;
        let mut k = 0;
        assert_eq!(
            d.decide(&c, load(0, 0, 1.0), tick(k)),
            1,
            "cold start at once"
        );
        // Wanting two: held for 30 s (ticks 0..300), then two.
        for _ in 0..300 {
            assert_eq!(d.decide(&c, load(1, 1, 2.0), tick(k)), 1, "tick {k}");
            k += 1;
        }
        assert_eq!(d.decide(&c, load(1, 1, 2.0), tick(k)), 2);
        k += 1;
        // Idle: held at two for 600 s, interrupted halfway (the wait restarts), then one.
        for _ in 0..3000 {
            assert_eq!(d.decide(&c, load(2, 2, 0.0), tick(k)), 2);
            k += 1;
        }
        assert_eq!(d.decide(&c, load(2, 2, 4.0), tick(k)), 2, "busy again");
        k += 1;
        for _ in 0..6000 {
            assert_eq!(d.decide(&c, load(2, 2, 0.0), tick(k)), 2, "tick {k}");
            k += 1;
        }
        assert_eq!(d.decide(&c, load(2, 2, 0.0), tick(k)), 1);
        k += 1;
        let to_zero_ticks = to_zero.map_or(6000, |s| s * 10);
        for _ in 0..to_zero_ticks {
            assert_eq!(d.decide(&c, load(1, 1, 0.0), tick(k)), 1, "tick {k}");
            k += 1;
        }
        assert_eq!(d.decide(&c, load(1, 1, 0.0), tick(k)), 0);
    }
}

#[test]
fn apply_scaling_factors() {
    // TestAutoscalingConfigParameters::test_apply_scaling_factors_upscale / _downscale /
    // _stuck_downscale: (desired 20 from 10, up 0.5) 15; (5 from 20, down 0.5) 13; (9 from
    // 10, down 0.5) 9, not stuck at 10.
    let mut c = config(0, 100, 1.0);
    c.upscaling_factor = 0.5;
    c.downscaling_factor = 0.5;
    assert_eq!(with_factors(&c, 20.0, 10), 15);
    assert_eq!(with_factors(&c, 5.0, 20), 13);
    assert_eq!(with_factors(&c, 9.0, 10), 9);
}

#[test]
fn apply_delay_logic() {
    // ::test_apply_delay_logic_upscale (0.3 s) and ::test_apply_delay_logic_downscale (0.3 s,
    // to zero 0.4 s).
    let ms = |n: u64| Duration::from_millis(n);
    let mut c = config(0, 10, 1.0);
    c.upscale_delay = ms(300);
    let mut d = Decider::default();
    let t0 = Instant::now();
    for t in [0, 50, 100] {
        assert_eq!(d.delayed(&c, 5, 1, t0 + ms(t)), 1);
    }
    assert_eq!(d.delayed(&c, 5, 1, t0 + ms(310)), 5);

    c.downscale_delay = ms(300);
    c.downscale_to_zero_delay = Some(ms(400));
    let mut d = Decider::default();
    for t in [0, 100, 200] {
        assert_eq!(d.delayed(&c, 0, 4, t0 + ms(t)), 4);
    }
    assert_eq!(d.delayed(&c, 0, 4, t0 + ms(310)), 1, "one first");
    for t in [500, 600, 700] {
        assert_eq!(d.delayed(&c, 0, 1, t0 + ms(t)), 1);
    }
    assert_eq!(d.delayed(&c, 0, 1, t0 + ms(910)), 0);
}

#[test]
fn upscale_delay_respected_with_slow_loop_steps() {
    // ::test_upscale_delay_respected_with_slow_loop_steps: 0.6 s a tick, 100 s delay; it
    // fires once 100 s have passed, not after 1,000 ticks.
    let mut c = config(1, 10, 1.0);
    c.upscale_delay = Duration::from_secs(100);
    let mut d = Decider::default();
    let start = Instant::now();
    let mut k = 0u32;
    let fired = loop {
        let now = start + Duration::from_millis(600) * k;
        if d.decide(&c, load(1, 1, 5.0), now) == 5 {
            break now - start;
        }
        k += 1;
    };
    assert!(fired >= Duration::from_secs(100) && fired <= Duration::from_millis(100_600));
}

#[test]
fn no_runaway_scaling_during_warmup() {
    // TestWarmupScalingFeedbackLoop::test_no_runaway_scaling_during_warmup: replicas still
    // starting (none running, no requests) keep the target, whatever the factor.
    for factor in [0.5, 1.0, 1.5, 2.0, 10.0] {
        let mut c = config(2, 10, 0.2);
        c.upscaling_factor = factor;
        let mut d = Decider::default();
        let now = Instant::now();
        for _ in 0..100 {
            assert_eq!(d.decide(&c, load(0, 2, 0.0), now), 2);
        }
    }
}

#[test]
fn rounding_bounds_and_idle_cases_as_the_wheel_computes_them() {
    // Run on the Ray 2.60.0 wheel's policy with delays 0 (target 2 unless said).
    let c = config(1, 100, 2.0);
    assert_eq!(once(&c, 1, 1, 2.5), 2, "1.25 rounds up");
    assert_eq!(once(&c, 3, 3, 7.0), 4, "3.5 rounds up");
    assert_eq!(once(&c, 3, 3, 5.0), 3, "2.5 rounds up to the current 3");
    assert_eq!(once(&config(1, 10, 2.0), 5, 5, 100.0), 10, "50, bounded");
    assert_eq!(
        once(&config(2, 10, 2.0), 5, 5, 0.0),
        2,
        "one, bounded by min 2"
    );
    assert_eq!(once(&config(0, 10, 2.0), 5, 5, 0.0), 1, "to one first");
    let c1 = config(0, 10, 1.0);
    assert_eq!(once(&c1, 2, 4, 6.0), 6);
    assert_eq!(once(&c1, 2, 4, 4.0), 4, "at the target: no change");
    let mut smooth = config(0, 100, 2.0);
    smooth.upscaling_factor = 0.5;
    assert_eq!(
        once(&smooth, 10, 10, 40.0),
        15,
        "half of the step from 10 to 20"
    );
}

#[test]
fn docs_example_three_replicas_serve_30_qps_of_100_ms_requests_at_target_one() {
    // advanced-autoscaling.md, on target_ongoing_requests: 30 QPS of 100 ms requests are 3
    // ongoing; at a target of 1 that is 3 replicas.
    assert_eq!(once(&config(1, 10, 1.0), 2, 2, 30.0 * 0.1), 3);
}

#[test]
fn loads_that_wait_for_a_load_slot_ask_for_replicas_that_requests_do_not() {
    // modelmux's own input: 2 requests (target 2: one replica's worth), but loads queued
    // behind full load slots need 3 replicas' slots.
    let c = config(1, 10, 2.0);
    let mut busy_loading = load(2, 2, 2.0);
    busy_loading.for_loads = 3;
    assert_eq!(
        Decider::default().decide(&c, busy_loading, Instant::now()),
        3
    );
    // And from zero, a load wanted is a start.
    let mut cold = load(0, 0, 0.0);
    cold.for_loads = 1;
    assert_eq!(
        Decider::default().decide(&config(0, 10, 2.0), cold, Instant::now()),
        1
    );
}
