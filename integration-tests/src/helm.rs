//! The Helm chart of `deploy/helm/rsembed`, offline: Helm v4 through
//! `python/helm_render.py` (the `helm-python-sdk` wheel), and the rendered
//! manifests as typed Kubernetes objects (`k8s-openapi`, plus the KEDA and
//! Prometheus Operator resources the chart uses).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, PodSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::{python, root};

/// The chart, relative to the repository root.
pub const CHART: &str = "deploy/helm/rsembed";
/// The release name of every test render.
pub const RELEASE: &str = "demo";
/// The namespace of every test render.
pub const NAMESPACE: &str = "rsembed";

/// `deploy/helm/rsembed/ci/<name>-values.yaml`.
pub fn values_file(name: &str) -> PathBuf {
    root().join(CHART).join(format!("ci/{name}-values.yaml"))
}

/// Lints, schema-checks and renders the chart with these values files and
/// `set` on top (`--stub-nats`: on a copy with an empty NATS chart). The
/// output of `helm_render.py` (values, lint, manifests, notes), or Helm's
/// error.
pub fn render(files: &[PathBuf], set: &Value, stub: bool) -> Result<Value, String> {
    let mut cmd = Command::new(python());
    cmd.arg(root().join("integration-tests/python/helm_render.py"))
        .arg(root().join(CHART))
        .args(["--release", RELEASE, "--namespace", NAMESPACE])
        .args(["--set-json", &set.to_string()]);
    for f in files {
        cmd.arg("-f").arg(f);
    }
    if stub {
        cmd.arg("--stub-nats");
    }
    let out = cmd.output().expect("python starts");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).expect("helm_render.py prints JSON"))
}

/// A YAML file as JSON, read by the same PyYAML the renderer uses.
pub fn python_yaml(path: &Path) -> Value {
    let out = Command::new(python())
        .args([
            "-c",
            "import json,sys,yaml; json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)",
        ])
        .arg(path)
        .output()
        .expect("python starts");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// A render of the chart for one set of values.
pub struct Render {
    /// The values file's name (`default` for `ci/default-values.yaml`).
    pub name: String,
    /// The values as written in the values file (for existing-secret names).
    pub given: Value,
    /// The values after Helm merged them with the defaults.
    pub values: Value,
    /// Every rendered manifest, typed.
    pub manifests: Vec<Manifest>,
    /// The rendered NOTES.txt.
    pub notes: String,
}

/// Lints and renders the chart with `ci/<name>-values.yaml`, parses every
/// manifest and checks that each survives the round trip through its type.
pub fn render_ci(name: &str, stub: bool) -> Render {
    let out = render(&[values_file(name)], &Value::Null, stub)
        .unwrap_or_else(|e| panic!("{name}: the chart does not render:\n{e}"));
    let lint = &out["lint"];
    // Without the stub, lint reports the dependency's missing directory even
    // when it is disabled (the reason for the stub); nothing else may show.
    let tolerated = |m: &Value| {
        !stub
            && m.as_str()
                .or(m["error"].as_str())
                .is_some_and(|e| e == "chart directory is missing these dependencies: nats")
    };
    let serious: Vec<&Value> = lint["messages"]
        .as_array()
        .expect("lint messages")
        .iter()
        .filter(|m| m["severity"].as_i64().unwrap_or(3) >= 2 && !tolerated(m))
        .chain(
            lint["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| !tolerated(e)),
        )
        .collect();
    assert!(serious.is_empty(), "{name}: helm lint --strict: {lint}");
    let manifests = out["manifests"]
        .as_array()
        .expect("manifests")
        .iter()
        .map(|m| parse(name, m["template"].as_str().unwrap_or("?"), &m["doc"]))
        .collect();
    let given = python_yaml(&values_file(name));
    Render {
        name: name.into(),
        given,
        values: out["values"].clone(),
        manifests,
        notes: out["notes"].as_str().unwrap_or_default().to_owned(),
    }
}

impl Render {
    /// The worker Deployment.
    pub fn deployment(&self) -> &Deployment {
        self.manifests
            .iter()
            .find_map(|m| match m {
                Manifest::Deployment(d) => Some(d.as_ref()),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: no worker Deployment", self.name))
    }

    /// The coordinator Job, when `job.enabled`.
    pub fn job(&self) -> Option<&Job> {
        self.manifests.iter().find_map(|m| match m {
            Manifest::Job(j) => Some(j.as_ref()),
            _ => None,
        })
    }

    /// The KEDA ScaledObject, when `keda.enabled`.
    pub fn scaled_object(&self) -> Option<&crd::Object<crd::ScaledObjectSpec>> {
        self.manifests.iter().find_map(|m| match m {
            Manifest::ScaledObject(s) => Some(s.as_ref()),
            _ => None,
        })
    }

    /// A merged value by JSON pointer (`/worker/gpu/enabled`); null when absent.
    pub fn value(&self, pointer: &str) -> &Value {
        self.values.pointer(pointer).unwrap_or(&Value::Null)
    }

    /// Every pod template the chart renders, with what runs it.
    pub fn pods(&self) -> Vec<(&'static str, &PodSpec)> {
        let mut pods = vec![("worker", pod_spec_of_deployment(self.deployment()))];
        if let Some(job) = self.job() {
            pods.push(("job", pod_spec_of_job(job)));
        }
        pods
    }

    /// Secrets the chart renders: name -> keys.
    pub fn rendered_secrets(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.manifests
            .iter()
            .filter_map(|m| match m {
                Manifest::Secret(s) => Some(s),
                _ => None,
            })
            .map(|s| {
                let mut keys: BTreeSet<String> = s
                    .string_data
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.clone())
                    .collect();
                keys.extend(s.data.iter().flatten().map(|(k, _)| k.clone()));
                (s.metadata.name.clone().expect("secrets are named"), keys)
            })
            .collect()
    }

    /// Secrets the values file says exist already (created by the user).
    pub fn existing_secrets(&self) -> BTreeSet<String> {
        [
            "/objectStore/existingSecret",
            "/queue/auth/existingSecret",
            "/queue/tls/existingSecret",
        ]
        .iter()
        .filter_map(|p| self.given.pointer(p).and_then(Value::as_str))
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
    }
}

/// A Deployment's pod spec.
pub fn pod_spec_of_deployment(d: &Deployment) -> &PodSpec {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a Deployment has a pod template")
}

/// A Job's pod spec.
pub fn pod_spec_of_job(j: &Job) -> &PodSpec {
    j.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("a Job has a pod template")
}

/// The literal value of a container's environment variable.
pub fn env<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

/// Init containers, then containers.
pub fn all_containers(pod: &PodSpec) -> impl Iterator<Item = &Container> {
    pod.init_containers.iter().flatten().chain(&pod.containers)
}

/// The Prometheus Operator and KEDA resources the chart renders, with the
/// fields of their CRDs that a chart may set (unknown ones are refused).
pub mod crd {
    use std::collections::BTreeMap;

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
    use serde::{Deserialize, Serialize};
    use serde_json::Value;

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Object<S> {
        pub api_version: String,
        pub kind: String,
        pub metadata: ObjectMeta,
        pub spec: S,
    }

    /// `keda.sh/v1alpha1` ScaledObject.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ScaledObjectSpec {
        pub scale_target_ref: ScaleTargetRef,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub polling_interval: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cooldown_period: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub initial_cooldown_period: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub idle_replica_count: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub min_replica_count: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_replica_count: Option<i32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub advanced: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub fallback: Option<Value>,
        pub triggers: Vec<Trigger>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ScaleTargetRef {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub api_version: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub kind: Option<String>,
        pub name: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub env_source_container_name: Option<String>,
    }

    /// A trigger: KEDA reads `metadata` as a map of strings.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Trigger {
        #[serde(rename = "type")]
        pub type_: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub name: Option<String>,
        pub metadata: BTreeMap<String, String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub metric_type: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub use_cached_metrics: Option<bool>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub authentication_ref: Option<Value>,
    }

    /// `monitoring.coreos.com/v1` PodMonitor.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct PodMonitorSpec {
        pub selector: LabelSelector,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub namespace_selector: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub job_label: Option<String>,
        pub pod_metrics_endpoints: Vec<Endpoint>,
    }

    /// `monitoring.coreos.com/v1` ServiceMonitor.
    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct ServiceMonitorSpec {
        pub selector: LabelSelector,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub namespace_selector: Option<Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub job_label: Option<String>,
        pub endpoints: Vec<Endpoint>,
    }

    #[derive(Debug, Serialize, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Endpoint {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub port: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub path: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub interval: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub scrape_timeout: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub scheme: Option<String>,
    }
}

/// One manifest, parsed into its type.
#[derive(Debug)]
#[allow(missing_docs)]
pub enum Manifest {
    Deployment(Box<Deployment>),
    Job(Box<Job>),
    Service(Box<Service>),
    ServiceAccount(Box<ServiceAccount>),
    Secret(Box<Secret>),
    Pdb(Box<PodDisruptionBudget>),
    ScaledObject(Box<crd::Object<crd::ScaledObjectSpec>>),
    PodMonitor(Box<crd::Object<crd::PodMonitorSpec>>),
    ServiceMonitor(Box<crd::Object<crd::ServiceMonitorSpec>>),
}

/// A rendered manifest as its type; panics, naming `values` and `template`,
/// on an unknown kind, an invalid object or a field the API does not have.
pub fn parse(values: &str, template: &str, doc: &Value) -> Manifest {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let at = format!("{values}: {template} ({kind})");
    match kind {
        "Deployment" => Manifest::Deployment(Box::new(typed(&at, doc))),
        "Job" => Manifest::Job(Box::new(typed(&at, doc))),
        "Service" => Manifest::Service(Box::new(typed(&at, doc))),
        "ServiceAccount" => Manifest::ServiceAccount(Box::new(typed(&at, doc))),
        "Secret" => Manifest::Secret(Box::new(typed(&at, doc))),
        "PodDisruptionBudget" => Manifest::Pdb(Box::new(typed(&at, doc))),
        "ScaledObject" => {
            assert_eq!(doc["apiVersion"], "keda.sh/v1alpha1", "{at}");
            Manifest::ScaledObject(Box::new(typed(&at, doc)))
        }
        "PodMonitor" | "ServiceMonitor" => {
            assert_eq!(doc["apiVersion"], "monitoring.coreos.com/v1", "{at}");
            if kind == "PodMonitor" {
                Manifest::PodMonitor(Box::new(typed(&at, doc)))
            } else {
                Manifest::ServiceMonitor(Box::new(typed(&at, doc)))
            }
        }
        other => panic!("{at}: no typed check for kind {other:?}"),
    }
}

/// `doc` as a `T`, which must serialise back to the same document: serde
/// ignores unknown keys, and so does k8s-openapi, so a key that does not come
/// back is a field the API does not have (a typo, a wrong level).
pub fn typed<T: DeserializeOwned + Serialize>(at: &str, doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{at}: not a valid object: {e}\n{doc:#}"));
    let back = serde_json::to_value(&t).expect("typed objects serialise");
    let mut diffs = Vec::new();
    compare(doc, &back, String::new(), &mut diffs);
    assert!(diffs.is_empty(), "{at}:\n  {}", diffs.join("\n  "));
    t
}

fn compare(rendered: &Value, back: &Value, path: String, diffs: &mut Vec<String>) {
    match (rendered, back) {
        (Value::Object(r), Value::Object(b)) => {
            for (k, v) in r {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    None if v.is_null() => diffs.push(format!("{p}: empty value")),
                    None => diffs.push(format!("{p}: unknown field")),
                    Some(bv) => compare(v, bv, p, diffs),
                }
            }
        }
        (Value::Array(r), Value::Array(b)) if r.len() == b.len() => {
            for (i, (rv, bv)) in r.iter().zip(b).enumerate() {
                compare(rv, bv, format!("{path}[{i}]"), diffs);
            }
        }
        (r, b) if r == b => {}
        (r, b) => diffs.push(format!("{path}: rendered {r}, read back as {b}")),
    }
}
