//! What `modelmux plan` replays: a deployment of a configuration as the server would run it
//! (its replicas, caps, load slots, eviction policy, queue), and what its models cost where a
//! synthetic kind says.

use std::num::NonZeroUsize;
use std::time::Duration;

use modelmux_cache::EvictionPolicy;
use modelmux_plan::{Costs, Setting};

use super::{
    Config, ConfigError, DeploymentConfig, EvictionPolicyName, ModelSpec, default_max_queued,
};

/// The setting and costs of deployment `name` of `config` (or of its only deployment that
/// serves a kind of model), and the deployment's name.
pub fn setting(
    config: &Config,
    name: Option<&str>,
) -> Result<(Setting, Costs, String), ConfigError> {
    let served: Vec<&DeploymentConfig> = config
        .applications
        .iter()
        .flat_map(|a| &a.deployments)
        .filter(|d| d.model.is_some())
        .collect();
    let d = match name {
        Some(name) => served.iter().find(|d| d.name == name).ok_or_else(|| {
            ConfigError::Invalid(format!(
                "no deployment named '{name}' serves a kind of model here (those that do: {})",
                names(&served)
            ))
        })?,
        None if served.len() == 1 => &served[0],
        None => {
            return Err(ConfigError::Invalid(format!(
                "name the deployment to plan with --deployment: {}",
                names(&served)
            )));
        }
    };
    let cap = d.max_models_per_replica.unwrap_or_default();
    let model = d.model.as_ref();
    // The kinds that build one deployment (synthetic, ONNX) serve 5 at once unless told; the
    // LLM kind's own default is the serve layer's.
    let default_ongoing = match model {
        Some(ModelSpec::Llm(_)) | None => None,
        _ => Some(5),
    };
    let setting = Setting {
        // (An autoscaled deployment is planned at its initial count: the replay does not
        // autoscale yet.)
        replicas: match d.autoscaling() {
            Ok(Some(a)) => a.start_replicas().max(1),
            _ => d
                .num_replicas
                .and_then(super::ReplicaCount::fixed)
                .unwrap_or(1),
        },
        max_models: cap.0,
        max_bytes: d.max_bytes_per_replica,
        max_concurrent_loads: super::concurrent_loads(d, cap),
        eviction: match d.eviction_policy {
            EvictionPolicyName::Lru => EvictionPolicy::Lru,
            EvictionPolicyName::Gdsf => EvictionPolicy::Gdsf,
        },
        max_ongoing_requests: d
            .max_ongoing_requests
            .map(NonZeroUsize::get)
            .or(default_ongoing),
        max_queued_requests: Some(d.max_queued_requests.unwrap_or_else(default_max_queued)),
        queue_timeout: Some(d.queue_timeout_s.0),
    };
    let costs = match model {
        Some(ModelSpec::Synthetic(s)) => Costs {
            load: Duration::from_millis(s.load_ms),
            service: Duration::from_millis(s.infer_ms),
            size_bytes: Some(s.size_bytes()),
        },
        _ => Costs::default(),
    };
    Ok((setting, costs, d.name.clone()))
}

fn names(served: &[&DeploymentConfig]) -> String {
    let names: Vec<&str> = served.iter().map(|d| d.name.as_str()).collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join(", ")
    }
}
