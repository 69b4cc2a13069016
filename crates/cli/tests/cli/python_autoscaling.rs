//! Ray's autoscaling options from Python, end to end: the real binary and workers, a Ray
//! user's deployments (`python_apps/autoscaled.py`) run unchanged but the import. Under
//! concurrent load the autoscaled deployment grows to its `max_replicas`, and shrinks back to
//! `min_replicas` when the load ends; `num_replicas="auto"` starts at Ray's preset's one.

use crate::common;

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use common::{python_apps_dir, python_package_dir, test_python};

fn serve(import_path: &str) -> common::Running {
    let config = format!(
        "http_options: {{port: 0}}\napplications:\n  - name: default\n    route_prefix: /\n    import_path: {import_path}\n    runtime_env: {{working_dir: {}}}\n",
        python_apps_dir().display()
    );
    let wrapper = [
        "env".to_string(),
        format!("MODELMUX_PYTHON={}", test_python()),
        format!("PYTHONPATH={}", python_package_dir().display()),
    ];
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    common::serve_in(&wrapper, &config, &[])
}

/// The deployment's replicas, from `/-/models`.
fn replicas(url: &str) -> usize {
    let builder = common::as_local_admin(url, http::Request::get("/-/models"));
    let (status, body) = common::send(url, builder, Vec::new());
    assert_eq!(status, 200, "{body}");
    let models: serde_json::Value = serde_json::from_str(&body).unwrap();
    models["applications"][0]["deployments"][0]["replicas"]
        .as_array()
        .map_or(0, Vec::len)
}

#[test]
fn a_ray_users_autoscaling_config_scales_up_under_load_and_back_down_after() {
    let server = serve("autoscaled:scaled");
    let url = server.url.clone();
    assert_eq!(replicas(&url), 1, "min_replicas");
    // 6 callers, 300 ms a request, a target of 1 per replica: 6 wanted, 3 at most.
    let until = Instant::now() + Duration::from_secs(8);
    let callers: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let mut pids = HashSet::new();
                while Instant::now() < until {
                    let (status, body) = common::send(&url, http::Request::get("/"), Vec::new());
                    assert_eq!(status, 200, "{body}");
                    pids.insert(body);
                }
                pids
            })
        })
        .collect();
    let mut most = 0;
    while Instant::now() < until {
        most = most.max(replicas(&url));
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut pids = HashSet::new();
    for c in callers {
        pids.extend(c.join().unwrap());
    }
    assert_eq!(most, 3, "grew to max_replicas");
    assert!(pids.len() >= 3, "served by {} worker processes", pids.len());
    // Idle: back to one after the 2 s delay (and the 1 s window).
    let deadline = Instant::now() + Duration::from_secs(15);
    while replicas(&url) > 1 {
        assert!(
            Instant::now() < deadline,
            "still {} replicas",
            replicas(&url)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn num_replicas_auto_starts_with_rays_preset_and_serves() {
    let server = serve("autoscaled:auto");
    assert_eq!(replicas(&server.url), 1, "the preset's min_replicas");
    let (status, body) = common::send(&server.url, http::Request::get("/"), Vec::new());
    assert_eq!(status, 200, "{body}");
}
