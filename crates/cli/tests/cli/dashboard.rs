//! The dashboard in a real browser: the demo's models behind an admin token, and Debian's
//! Chromium driven headless by `scripts/dashboard/browser_check.py` (Selenium with
//! chromium-driver): the page loads without console errors, a model requested appears under
//! the replica that loaded it within 2 s, a pin clicked in the page shows in `/-/models`, an
//! action without the token is refused, and a screenshot is saved under `target/`.
//! Chromium, chromedriver and Selenium are installed by `scripts/test`; without them the
//! test fails.

use crate::common;

use std::path::PathBuf;
use std::process::Command;

const CONFIG: &str = "
http_options:
  host: 127.0.0.1
  port: 0
  admin_token: dashboard-test-token
applications:
  - name: default
    route_prefix: /
    deployments:
      - name: Classifier
        num_replicas: 2
        max_ongoing_requests: 8
        max_models_per_replica: 3
        model:
          kind: onnx
          repository: builtin://demo
";

fn python() -> String {
    std::env::var("MODELMUX_TEST_PYTHON").unwrap_or_else(|_| {
        panic!("MODELMUX_TEST_PYTHON must name a Python with selenium (scripts/test sets it)")
    })
}

#[test]
fn the_dashboard_shows_models_as_they_load_and_pins_with_the_token_only() {
    for tool in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(tool).exists(),
            "{tool} is missing: install Debian's chromium and chromium-driver (scripts/test does)"
        );
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let shot = root.join("target/dashboard.png");
    let _ = std::fs::remove_file(&shot);
    let mut server = common::serve(CONFIG);
    let output = Command::new(python())
        .arg(root.join("scripts/dashboard/browser_check.py"))
        .args(["--url", &server.url])
        .args(["--token", "dashboard-test-token"])
        .args(["--deployment", "Classifier"])
        .args(["--model", "customer-3"])
        .arg("--screenshot")
        .arg(&shot)
        .output()
        .expect("running the browser check");
    let (_, logs) = server.terminate();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{said}");
    assert!(
        output.status.success(),
        "the browser check failed:\n{said}\nserver logs:\n{logs}"
    );
    let size = std::fs::metadata(&shot).map_or(0, |m| m.len());
    assert!(
        size > 10_000,
        "no screenshot at {} ({size} bytes)",
        shot.display()
    );
}
