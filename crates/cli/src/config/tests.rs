//! The configuration's parsing and checks.

use super::*;

/// Why building the server for `yaml` (which parses) fails.
async fn build_error(yaml: &str) -> String {
    Config::parse(yaml)
        .unwrap()
        .server()
        .await
        .err()
        .expect("the server must not build")
        .to_string()
}

/// Whether this build has `feature` (one of [`FEATURES`]).
fn built(feature: &str) -> bool {
    FEATURES
        .iter()
        .find(|(name, _)| *name == feature)
        .unwrap_or_else(|| panic!("no feature {feature}"))
        .1
}

#[tokio::test]
async fn the_demo_and_the_examples_parse() {
    if built("onnx") {
        let c = Config::parse(DEMO).unwrap();
        assert_eq!(
            c.applications[0].deployments[0]
                .num_replicas
                .unwrap()
                .fixed()
                .unwrap(),
            2
        );
        assert!(c.server().await.is_ok());
    }
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
    for (example, feature) in [
        ("synthetic.yaml", None),
        ("onnx-local.yaml", Some("onnx")),
        ("onnx-s3.yaml", Some("onnx")),
        ("llm.yaml", Some("llm")),
    ] {
        if feature.is_some_and(|f| !built(f)) {
            continue;
        }
        let text = std::fs::read_to_string(format!("{root}examples/{example}")).unwrap();
        Config::parse(&text).unwrap_or_else(|e| panic!("{example}: {e}"));
    }
}

#[tokio::test]
async fn repositories_are_opened_when_the_server_is_built() {
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: /no/such/dir}\n";
    let err = build_error(yaml).await;
    assert!(
        err.contains("deployments[0].model") && err.contains("/no/such/dir"),
        "{err}"
    );
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: 's3://b/p', options: {colour: red}}\n";
    let err = build_error(yaml).await;
    assert!(err.contains("unknown S3 option 'colour'"), "{err}");
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: 'ftp://x/y'}\n";
    let err = build_error(yaml).await;
    assert!(
        err.contains("unsupported repository scheme 'ftp://'"),
        "{err}"
    );
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: x, download: {attempts: 0}}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    assert!(err.contains("attempts"), "{err}");
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: x, download: {backoff_base_s: 20}}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    assert!(err.contains("backoff_base_s is larger"), "{err}");
    // Option values may be YAML booleans and numbers.
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: 's3://b/p', options: {allow_http: true, region: us-east-1}}\n";
    assert!(Config::parse(yaml).unwrap().server().await.is_ok());
    // A check looks at the disk cache's directory without taking or emptying it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("precious"), b"x").unwrap();
    let yaml = format!(
        "disk_cache: {{path: '{}'}}\napplications:\n  - name: a\n    deployments:\n      - name: d\n        model: {{kind: onnx, repository: 's3://b/p'}}\n",
        dir.path().display()
    );
    let config = Config::parse(&yaml).unwrap();
    let err = config.check().await.unwrap_err().to_string();
    assert!(err.contains("not empty"), "{err}");
    assert!(dir.path().join("precious").exists());
    let cache = dir.path().join("cache");
    let yaml = yaml.replace(
        &dir.path().display().to_string(),
        &cache.display().to_string(),
    );
    let config = Config::parse(&yaml).unwrap();
    let _running = config.server().await.unwrap();
    config.check().await.unwrap_err(); // in use by the "running server" above
    drop(_running);
}

#[test]
fn errors_name_the_field_and_the_line() {
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        num_replicas: 0\n        model: {kind: synthetic}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    assert!(
        err.contains("num_replicas") && err.contains("line 5"),
        "{err}"
    );

    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: synthetic, size_gb: 1}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    // Inside `model` (a tagged enum, buffered by serde) the line is the deployment's.
    assert!(
        err.contains("deployments[0]") && err.contains("size_gb") && err.contains("line 4"),
        "{err}"
    );

    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: pytorch}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    assert!(
        err.contains("pytorch") && err.contains("synthetic"),
        "{err}"
    );

    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        max_models_per_replica: 0\n        model: {kind: synthetic}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    assert!(
        err.contains("-1 for no limit") && err.contains("line 5"),
        "{err}"
    );
}

#[test]
fn cross_field_errors_name_the_path() {
    let yaml = "applications:\n  - name: a\n    ingress: nope\n    deployments:\n      - name: d\n        model: {kind: synthetic}\n";
    let err = Config::parse(yaml).unwrap_err().to_string();
    assert!(err.contains("applications[0].ingress"), "{err}");
    let yaml = "http_options: {host: localhost}\napplications: []\n";
    assert!(Config::parse(yaml).is_err());
}

#[test]
fn eviction_policies_are_named() {
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        eviction_policy: gdsf\n        model: {kind: synthetic}\n";
    let c = Config::parse(yaml).unwrap();
    assert!(matches!(
        c.applications[0].deployments[0].eviction_policy,
        EvictionPolicyName::Gdsf
    ));
    let err = Config::parse(&yaml.replace("gdsf", "fifo"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("fifo") && err.contains("lru") && err.contains("line 5"),
        "{err}"
    );
}

#[test]
fn what_the_server_would_refuse_is_refused_when_parsing() {
    let app = |prefix: &str| {
        format!(
            "  - name: a{}\n    route_prefix: '{prefix}'\n    deployments:\n      - name: d\n        model: {{kind: synthetic}}\n",
            prefix.len()
        )
    };
    for (prefix, expect) in [
        ("api", "must start with '/'"),
        ("/api/", "must start with '/'"),
        ("/-/x", "reserved"),
        ("/metrics", "reserved"),
    ] {
        let err = Config::parse(&format!("applications:\n{}", app(prefix)))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("route_prefix") && err.contains(expect),
            "{prefix}: {err}"
        );
    }
    let twice = format!(
        "applications:\n{}{}",
        app("/a"),
        app("/a").replace("name: a2", "name: b2")
    );
    assert!(
        Config::parse(&twice)
            .unwrap_err()
            .to_string()
            .contains("used by another application")
    );
    let yaml = "logging: {level: 'info,[['}\napplications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: synthetic}\n";
    assert!(
        Config::parse(yaml)
            .unwrap_err()
            .to_string()
            .contains("logging.level")
    );
}

#[test]
fn minus_one_means_unbounded() {
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        max_models_per_replica: -1\n        model: {kind: synthetic}\n";
    let c = Config::parse(yaml).unwrap();
    assert!(
        c.applications[0].deployments[0]
            .max_models_per_replica
            .unwrap()
            .0
            .is_none()
    );
}

#[cfg(feature = "llm")]
#[tokio::test]
async fn llm_settings_are_checked_with_their_path() {
    let yaml = |model: &str| {
        format!(
            "applications:\n  - name: a\n    deployments:\n      - name: LLM\n        model:\n{model}"
        )
    };
    let good = "          kind: llm\n          model_loading_config: {model_id: m, model_source: /no/such.gguf}\n";
    let err = Config::parse(&yaml(&format!(
        "{good}          lora_config: {{dynamic_lora_loading_path: /x, max_adapters: 3}}\n"
    )))
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("max_adapters") && err.contains("line"),
        "{err}"
    );
    let err = build_error(&yaml(good)).await;
    assert!(
        err.contains("deployments[0].model") && err.contains("/no/such.gguf"),
        "{err}"
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    let with_file = good.replace("/no/such.gguf", file.path().to_str().unwrap());
    let err = build_error(&yaml(&format!(
        "{with_file}          engine_kwargs: {{max_num_seqs: 0}}\n"
    )))
    .await;
    assert!(err.contains("engine_kwargs.max_num_seqs"), "{err}");
    let err = build_error(&yaml(&with_file.replace("model_id: m", "model_id: 'm:x'"))).await;
    assert!(err.contains("model_id"), "{err}");
    // The settings are fine, but an empty file is no GGUF model: refused before any replica
    // starts (a real model builds: `tests/llm.rs`, which has one).
    let err = build_error(&yaml(&with_file)).await;
    assert!(
        err.contains("model_source") && err.contains("not a readable GGUF file"),
        "{err}"
    );
}

#[cfg(feature = "cluster")]
#[test]
fn cluster_settings_are_read_and_checked() {
    let listen: std::net::SocketAddr = "127.0.0.1:8000".parse().unwrap();
    let flags = ClusterFlags {
        etcd: Some("etcd://127.0.0.1:2379".into()),
        node_id: Some("n1".into()),
        ..ClusterFlags::default()
    };
    let with = |cluster: &str| {
        let yaml = format!(
            "cluster:\n{cluster}\napplications:\n  - name: a\n    deployments:\n      - name: d\n        model: {{kind: synthetic}}\n"
        );
        Config::parse(&yaml)
            .unwrap()
            .cluster
            .options(&flags, listen)
    };
    let options = with("  peer_timeout_s: 2.5\n  lease_ttl_s: 4")
        .unwrap()
        .unwrap();
    assert_eq!(options.peer_timeout, Duration::from_millis(2500));
    assert_eq!(options.lease_ttl, Duration::from_secs(4));
    assert_eq!(options.advertise, "http://127.0.0.1:8000");
    let err = with("  peer_timeout_s: 0.01").unwrap_err().to_string();
    assert!(err.contains("peer_timeout_s"), "{err}");
    let err = with("  name: a/b").unwrap_err().to_string();
    assert!(err.contains("name"), "{err}");
}

#[cfg(feature = "cluster")]
#[test]
fn etcd_tls_and_auth_settings_are_read_from_files_and_checked_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let listen: std::net::SocketAddr = "127.0.0.1:8000".parse().unwrap();
    let flags = ClusterFlags {
        etcd: Some("etcd://127.0.0.1:2379".into()),
        node_id: Some("n1".into()),
        ..ClusterFlags::default()
    };
    let with = |cluster: &str| {
        let yaml = format!(
            "cluster:\n{cluster}\napplications:\n  - name: a\n    deployments:\n      - name: d\n        model: {{kind: synthetic}}\n"
        );
        let mut config = Config::parse(&yaml).map_err(|e| e.to_string())?;
        config.resolve_paths(dir.path());
        config
            .cluster
            .options(&flags, listen)
            .map_err(|e| e.to_string())
    };
    // A password file beside the configuration, named relative to it.
    std::fs::write(dir.path().join("etcd-password"), "s3cret\n").unwrap();
    let options = with("  etcd_auth: {username: modelmux, password_file: etcd-password}")
        .unwrap()
        .unwrap();
    let credentials = options.etcd_security.credentials.unwrap();
    assert_eq!(credentials.user(), "modelmux");
    assert!(!format!("{credentials:?}").contains("s3cret"));
    assert!(options.etcd_security.tls.is_none());

    // Each missing or wrong piece is an error that names its key.
    let err = with("  etcd_tls: {ca_file: no-such-ca.pem}").unwrap_err();
    assert!(
        err.contains("cluster.etcd_tls.ca_file") && err.contains("no-such-ca.pem"),
        "{err}"
    );
    let err = with("  etcd_auth: {username: modelmux, password_file: nowhere}").unwrap_err();
    assert!(err.contains("cluster.etcd_auth.password_file"), "{err}");
    let err = with("  etcd_auth: {username: modelmux, password_env: MODELMUX_TEST_UNSET_PW}")
        .unwrap_err();
    assert!(
        err.contains("cluster.etcd_auth.password_env") && err.contains("MODELMUX_TEST_UNSET_PW"),
        "{err}"
    );
    let err = with("  etcd_auth: {username: modelmux}").unwrap_err();
    assert!(err.contains("password_file or password_env"), "{err}");
    let err = with("  etcd_auth: {username: '', password_file: etcd-password}").unwrap_err();
    assert!(err.contains("cluster.etcd_auth.username"), "{err}");
    // The password itself has no key: it is never in the configuration.
    let err = with("  etcd_auth: {username: modelmux, password: s3cret}").unwrap_err();
    assert!(err.contains("password"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}

#[test]
fn a_deployment_without_cache_settings_gets_the_documented_defaults() {
    let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: synthetic}\n";
    let c = Config::parse(yaml).unwrap();
    let d = &c.applications[0].deployments[0];
    let cache = cache_settings(d, None);
    let got = cache.config();
    // GDSF, not Ray's LRU; 3 models per replica (Ray's default); loads at once: half the
    // model slots rounded up, at most 4.
    assert_eq!(got.eviction, EvictionPolicy::Gdsf);
    assert_eq!(got.max_models, Some(3));
    assert_eq!(got.max_concurrent_loads, 2);
    for (models, loads) in [("1", 1), ("7", 4), ("20", 4), ("-1", 4)] {
        let yaml = yaml.replace(
            "        model:",
            &format!("        max_models_per_replica: {models}\n        model:"),
        );
        let c = Config::parse(&yaml).unwrap();
        let cache = cache_settings(&c.applications[0].deployments[0], None);
        assert_eq!(
            cache.config().max_concurrent_loads,
            loads,
            "{models} models"
        );
    }
}

#[cfg(feature = "python")]
#[test]
fn python_applications_take_overrides_and_only_they_take_python_keys() {
    let ok = "applications:\n  - name: a\n    import_path: app:entry\n    runtime_env: {working_dir: src}\n    deployments:\n      - name: Model\n        num_replicas: 2\n        user_config: {threshold: 0.5}\n";
    let c = Config::parse(ok).unwrap();
    let d = &c.applications[0].deployments[0];
    assert_eq!(d.num_replicas.unwrap().fixed().unwrap(), 2);
    assert_eq!(d.user_config, Some(serde_json::json!({"threshold": 0.5})));
    assert!(d.model.is_none());
    let no_deployments = "applications:\n  - name: a\n    import_path: app:entry\n";
    assert!(Config::parse(no_deployments).is_ok());

    let refused = |yaml: &str, says: &str| {
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    };
    refused(
        "applications:\n  - name: a\n    import_path: app:entry\n    deployments:\n      - name: M\n        model: {kind: synthetic}\n",
        "deployments[0].model: a Python application's deployments are its code's",
    );
    refused(
        "applications:\n  - name: a\n    deployments:\n      - name: M\n        user_config: {}\n        model: {kind: synthetic}\n",
        "user_config: only a Python deployment takes it",
    );
    refused(
        "applications:\n  - name: a\n    runtime_env: {working_dir: x}\n    deployments:\n      - name: M\n        model: {kind: synthetic}\n",
        "runtime_env: only a Python application",
    );
    refused(
        "applications:\n  - name: a\n    deployments:\n      - name: M\n",
        "deployments[0].model: missing",
    );
    // Ray's runtime_env keys that need a package manager are named, not ignored.
    refused(
        "applications:\n  - name: a\n    import_path: app:entry\n    runtime_env: {pip: [numpy]}\n",
        "pip",
    );
    refused(
        "applications:\n  - name: a\n    import_path: ' '\n",
        "import_path",
    );
}

/// A configuration that needs a part this binary was built without (the CLI's features) is
/// refused, the error naming the feature and where the configuration asks for it; one that
/// the build has parses. Run with every feature and with `--no-default-features --features
/// onnx`, it sees both sides.
#[test]
fn a_part_left_out_of_the_build_is_named_where_the_configuration_asks_for_it() {
    let app = |model: &str| {
        format!(
            "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {model}\n"
        )
    };
    let cases = [
        (
            "onnx",
            app("{kind: onnx, repository: models}"),
            "deployments[0]: this modelmux",
        ),
        (
            "llm",
            app("{kind: llm, model_loading_config: {model_id: m, model_source: m.gguf}}"),
            "applications[0].deployments[0]: this modelmux",
        ),
        (
            "python",
            "applications:\n  - name: a\n    import_path: app:entry\n".into(),
            "applications[0] ('a'): import_path",
        ),
        (
            "cluster",
            format!(
                "cluster: {{etcd: 'etcd://127.0.0.1:2379', node_id: n1}}\n{}",
                app("{kind: synthetic}")
            ),
            "the `cluster` section",
        ),
    ];
    for (feature, yaml, place) in cases {
        match Config::parse(&yaml) {
            Ok(_) => assert!(built(feature), "{feature}: parsed without it"),
            Err(e) => {
                let e = e.to_string();
                assert!(!built(feature), "{feature}: {e}");
                assert!(
                    e.contains(&format!(
                        "this modelmux was built without the `{feature}` feature"
                    )) && e.contains(&format!("--features {feature}"))
                        && e.contains(place),
                    "{feature}: {e}"
                );
            }
        }
    }
}

/// Without the `cluster` feature, the cluster's flags, `--role` and `deploy --cluster` are
/// refused with the same words.
#[cfg(not(feature = "cluster"))]
#[tokio::test]
async fn without_the_cluster_feature_its_flags_and_deploy_are_refused() {
    let c = Config::parse(
        "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: synthetic}\n",
    )
    .unwrap();
    let listen = "127.0.0.1:0".parse().unwrap();
    assert!(
        c.cluster
            .options(&ClusterFlags::default(), listen)
            .unwrap()
            .is_none()
    );
    let flags = ClusterFlags {
        etcd: Some("etcd://127.0.0.1:2379".into()),
        ..ClusterFlags::default()
    };
    let words = "this modelmux was built without the `cluster` feature";
    let err = c.cluster.options(&flags, listen).unwrap_err().to_string();
    assert!(err.contains(words) && err.contains("--cluster"), "{err}");
    let err = cluster::parse_role("both").unwrap_err();
    assert!(err.contains(words) && err.contains("--role"), "{err}");
    let err = cluster::deploy(std::path::Path::new("x.yaml"), "etcd://h:2379", None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(words) && err.contains("deploy --cluster"),
        "{err}"
    );
}

/// A deployment of synthetic models with `scaling` (YAML lines at the deployment's indent).
fn scaled(scaling: &str) -> Result<Config, ConfigError> {
    Config::parse(&format!(
        "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {{kind: synthetic}}\n{scaling}"
    ))
}

#[test]
fn num_replicas_auto_and_autoscaling_config_take_rays_keys_and_defaults() {
    let auto = scaled("        num_replicas: auto\n").unwrap();
    let a = auto.applications[0].deployments[0]
        .autoscaling()
        .unwrap()
        .unwrap();
    assert_eq!(
        (a.min_replicas, a.max_replicas, a.target_ongoing_requests),
        (1, 100, 2.0)
    );

    // Keys beside `auto` override its preset; without `auto`, the rest are Ray's class
    // defaults (max_replicas 1), and the deprecated factor names still count.
    let c = scaled("        num_replicas: auto\n        autoscaling_config: {max_replicas: 7, upscale_delay_s: 0}\n").unwrap();
    let a = c.applications[0].deployments[0]
        .autoscaling()
        .unwrap()
        .unwrap();
    assert_eq!((a.max_replicas, a.upscale_delay), (7, Duration::ZERO));
    assert_eq!(a.downscale_delay, Duration::from_secs(600));
    let c = scaled("        autoscaling_config:\n          min_replicas: 0\n          initial_replicas: 0\n          smoothing_factor: 0.5\n          upscale_smoothing_factor: 0.3\n          aggregation_function: MAX\n").unwrap();
    let a = c.applications[0].deployments[0]
        .autoscaling()
        .unwrap()
        .unwrap();
    assert_eq!(
        (a.min_replicas, a.max_replicas, a.start_replicas()),
        (0, 1, 0)
    );
    assert_eq!((a.upscaling_factor, a.downscaling_factor), (0.3, 0.5));
    assert_eq!(a.aggregation, modelmux_serve::Aggregation::Max);
    let fixed = scaled("        num_replicas: 3\n").unwrap();
    assert_eq!(fixed.applications[0].deployments[0].autoscaling(), Ok(None));
}

#[test]
fn inconsistent_or_unknown_autoscaling_keys_are_refused_by_name() {
    let err = |scaling: &str| scaled(scaling).unwrap_err().to_string();
    let e = err("        num_replicas: 2\n        autoscaling_config: {max_replicas: 4}\n");
    assert!(
        e.contains("num_replicas") && e.contains("autoscaling_config"),
        "{e}"
    );
    let e = err("        autoscaling_config: {min_replicas: 5, max_replicas: 4}\n");
    assert!(
        e.contains("min_replicas (5) is above max_replicas (4)"),
        "{e}"
    );
    let e = err("        autoscaling_config: {max_replicas: 4, initial_replicas: 9}\n");
    assert!(e.contains("initial_replicas"), "{e}");
    let e = err("        autoscaling_config: {aggregation_function: median}\n");
    assert!(e.contains("median"), "{e}");
    // Ray's removed name is refused here, where Ray ignores it without a word.
    let e =
        err("        autoscaling_config:\n          target_num_ongoing_requests_per_replica: 3\n");
    assert!(
        e.contains("target_num_ongoing_requests_per_replica") && e.contains("line 7"),
        "{e}"
    );
    let e = err("        autoscaling_config: {upscale_delay_s: -1}\n");
    assert!(
        e.contains("upscale_delay_s") || e.contains("0 or more"),
        "{e}"
    );
    let e = err("        num_replicas: many\n");
    assert!(e.contains("\"auto\"") && e.contains("line 6"), "{e}");
}
