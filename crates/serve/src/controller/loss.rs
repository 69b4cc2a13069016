//! Which replicas a scale-down takes: those whose loss costs least. A model held on another
//! replica too costs nothing; a model held only on the leaver costs what its next requests
//! will wait for its reload: its load time times its recent request rate. A request rate
//! needs history the caches do not keep, so it is estimated from the model's idle time (a
//! model last used `idle` ago is asked for about once per `idle`), and a model idle past
//! `recent` counts as no traffic. Ties go to the replica with fewer requests in flight, then
//! the one idle longest.

use std::time::Duration;

/// A loaded copy on a replica.
#[derive(Debug, Clone)]
pub(super) struct Copy {
    /// The model.
    pub(super) id: String,
    /// How long since it was last used.
    pub(super) idle: Duration,
    /// How long its load took, if known (else the mean of the known ones, or a second).
    pub(super) load_time: Option<Duration>,
}

/// The `n` replicas (indices into `models`, one list of copies per replica, and `inside`,
/// requests in flight per replica) whose loss costs least, cheapest first.
pub(super) fn cheapest(
    models: &[Vec<Copy>],
    inside: &[usize],
    n: usize,
    recent: Duration,
) -> Vec<usize> {
    let known: Vec<f64> = models
        .iter()
        .flatten()
        .filter_map(|c| c.load_time.map(|t| t.as_secs_f64()))
        .collect();
    let typical = if known.is_empty() {
        1.0
    } else {
        known.iter().sum::<f64>() / known.len() as f64
    };
    let held_elsewhere = |i: usize, id: &str| {
        (models.iter().enumerate()).any(|(j, other)| j != i && other.iter().any(|c| c.id == id))
    };
    let mut order: Vec<(f64, usize, std::cmp::Reverse<Duration>, usize)> = models
        .iter()
        .enumerate()
        .map(|(i, copies)| {
            let cost: f64 = copies
                .iter()
                .filter(|c| c.idle < recent && !held_elsewhere(i, &c.id))
                .map(|c| {
                    let load = c.load_time.map_or(typical, |t| t.as_secs_f64());
                    load / c.idle.as_secs_f64().max(0.1)
                })
                .sum();
            let most_recent = copies.iter().map(|c| c.idle).min().unwrap_or(Duration::MAX);
            (cost, inside[i], std::cmp::Reverse(most_recent), i)
        })
        .collect();
    order.sort_by(|a, b| {
        (a.0.total_cmp(&b.0))
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
    });
    order.into_iter().take(n).map(|(_, _, _, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(id: &str, idle_s: f64, load_s: f64) -> Copy {
        Copy {
            id: id.into(),
            idle: Duration::from_secs_f64(idle_s),
            load_time: Some(Duration::from_secs_f64(load_s)),
        }
    }

    const RECENT: Duration = Duration::from_secs(60);

    #[test]
    fn a_replica_whose_models_are_all_held_elsewhere_goes_first() {
        let models = vec![
            vec![copy("a", 1.0, 1.0), copy("b", 1.0, 1.0)],
            vec![
                copy("a", 1.0, 1.0),
                copy("b", 1.0, 1.0),
                copy("c", 1.0, 1.0),
            ],
            vec![copy("d", 1.0, 1.0)],
        ];
        assert_eq!(
            cheapest(&models, &[3, 0, 0], 1, RECENT),
            [0],
            "busier, but free to lose"
        );
    }

    #[test]
    fn a_model_only_there_costs_its_load_time_times_its_rate() {
        // One hot model with a 10 s load, against two with 0.1 s loads: the count of models
        // held only there would take the first replica; the wait it costs says the second.
        let models = vec![
            vec![copy("x", 1.0, 10.0)],
            vec![copy("y", 1.0, 0.1), copy("z", 1.0, 0.1)],
        ];
        assert_eq!(cheapest(&models, &[0, 0], 1, RECENT), [1]);
        // The same load, asked for a hundred times less often: the first is cheaper.
        let models = vec![vec![copy("x", 50.0, 1.0)], vec![copy("y", 0.5, 1.0)]];
        assert_eq!(cheapest(&models, &[0, 0], 1, RECENT), [0]);
    }

    #[test]
    fn models_idle_past_recent_cost_nothing_and_ties_go_to_the_idle() {
        let models = vec![
            vec![copy("old", 120.0, 30.0)],
            vec![copy("older", 600.0, 30.0)],
            vec![copy("hot", 0.5, 0.1)],
        ];
        assert_eq!(cheapest(&models, &[0, 0, 0], 2, RECENT), [1, 0]);
    }
}
