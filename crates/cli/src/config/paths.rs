//! Relative paths in a configuration file are read from the file's own directory, as a user
//! who writes `repository: models` beside `config.yaml` means, whatever directory the server
//! is started from.

use std::path::{Path, PathBuf};

use super::{Config, ModelSpec};

impl Config {
    /// Makes every relative local path in the configuration relative to `dir` (the config
    /// file's directory): `disk_cache.path`, the cluster's `etcd_tls` files and
    /// `etcd_auth.password_file`, an ONNX `repository`, an LLM's `model_source` and
    /// `dynamic_lora_loading_path`, a Python application's `runtime_env.working_dir` and
    /// `python` (when it is a path, not a command). URLs (`s3://`, `https://`, `file://`, `builtin://`) and
    /// absolute paths are left as they are.
    pub fn resolve_paths(&mut self, dir: &Path) {
        // An absolute directory, so errors name the full path that was tried.
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if let Some(path) = &mut self.disk_cache.path
            && path.is_relative()
        {
            *path = dir.join(&*path);
        }
        for path in self.cluster.files() {
            if path.is_relative() {
                *path = dir.join(&*path);
            }
        }
        for app in &mut self.applications {
            if let Some(working_dir) = &mut app.runtime_env.working_dir
                && working_dir.is_relative()
            {
                *working_dir = dir.join(&*working_dir);
            }
            // An interpreter named by a path (not a bare command found on PATH).
            if let Some(python) = &mut app.python
                && python.is_relative()
                && python.components().count() > 1
            {
                *python = dir.join(&*python);
            }
        }
        for deployment in self
            .applications
            .iter_mut()
            .flat_map(|a| &mut a.deployments)
        {
            for location in deployment.model.iter_mut().flat_map(ModelSpec::locations) {
                resolve(&dir, location);
            }
        }
    }
}

/// `location` joined to `dir` if it is a relative local path.
fn resolve(dir: &Path, location: &mut String) {
    if location.is_empty() || location.contains("://") || Path::new(location).is_absolute() {
        return;
    }
    *location = path_text(dir.join(&*location));
}

fn path_text(path: PathBuf) -> String {
    path.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(all(feature = "onnx", feature = "llm"))]
    const YAML: &str = "\
disk_cache: {path: cache}
applications:
  - name: a
    deployments:
      - name: onnx
        model: {kind: onnx, repository: models}
      - name: s3
        model: {kind: onnx, repository: 's3://bucket/models'}
      - name: abs
        model: {kind: onnx, repository: /srv/models}
      - name: demo
        model: {kind: onnx, repository: 'builtin://demo'}
      - name: llm
        model:
          kind: llm
          model_loading_config: {model_id: m, model_source: ../weights/m.gguf}
          lora_config: {dynamic_lora_loading_path: adapters}
";

    /// Each deployment's locations, space-separated.
    #[cfg(all(feature = "onnx", feature = "llm"))]
    fn locations(c: &mut Config) -> Vec<String> {
        c.applications[0]
            .deployments
            .iter_mut()
            .map(|d| {
                let paths = d.model.as_mut().unwrap().locations();
                let paths: Vec<&str> = paths.iter().map(|l| l.as_str()).collect();
                paths.join(" ")
            })
            .collect()
    }

    #[cfg(all(feature = "onnx", feature = "llm"))]
    #[test]
    fn relative_paths_are_read_from_the_config_files_directory() {
        let dir = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(dir.path()).unwrap();
        let mut c = Config::parse(YAML).unwrap();
        c.resolve_paths(dir.path());
        let at = |p: &str| path_text(base.join(p));
        assert_eq!(
            locations(&mut c),
            [
                at("models"),
                "s3://bucket/models".into(),
                "/srv/models".into(),
                "builtin://demo".into(),
                format!("{} {}", at("../weights/m.gguf"), at("adapters")),
            ]
        );
        assert_eq!(c.disk_cache.path, Some(base.join("cache")));
    }

    /// The user's case: `repository: models` beside the config file, the server started from
    /// elsewhere.
    #[cfg(feature = "onnx")]
    #[tokio::test]
    async fn a_repository_beside_the_config_file_opens_from_any_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        let demo = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/models/customer-1"
        );
        std::fs::create_dir_all(dir.path().join("models/customer-1")).unwrap();
        std::fs::copy(
            format!("{demo}/model.onnx"),
            dir.path().join("models/customer-1/model.onnx"),
        )
        .unwrap();
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: models}\n";
        let unresolved = Config::parse(yaml).unwrap().check().await;
        assert!(
            unresolved.is_err(),
            "the test's cwd has no models/ directory"
        );
        let mut c = Config::parse(yaml).unwrap();
        c.resolve_paths(dir.path());
        c.check().await.unwrap();
    }
}
