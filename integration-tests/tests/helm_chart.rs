//! The Helm chart of `deploy/helm/rsembed`, validated offline: Helm v4 (the
//! `helm-python-sdk` wheel: Helm's Go SDK as a library, no binary, no cluster)
//! lints it strictly, checks the values against `values.schema.json` and
//! renders it for each values file of `deploy/helm/rsembed/ci/`
//! (`python/helm_render.py`). Every rendered manifest is parsed into its
//! `k8s-openapi` type (or, for the KEDA and Prometheus Operator resources,
//! into the typed structs below) and serialised back: a key of the rendered
//! document that does not come back is a field Kubernetes does not know.
//! Then what matters is checked: GPU limits, probe paths against the worker's
//! real endpoints, Secret references, the flags and variables the binaries
//! read, the Job's steps, and KEDA's stream and consumer against what
//! `rsembed submit` creates on a real nats-server.
//!
//! The official NATS chart is a dependency we do not vendor: `helm lint`
//! needs its directory even when it is disabled, so lint and the renders with
//! the in-chart NATS use a copy of the chart with an empty stub in `charts/`;
//! the external-NATS render also runs without the stub.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Container;
use rsembed_integration_tests::cluster::submit_ok;
use rsembed_integration_tests::helm::{
    all_containers, env, pod_spec_of_deployment, pod_spec_of_job, render_ci, values_file, Manifest,
    Render, NAMESPACE, RELEASE,
};
use rsembed_integration_tests::nats::NatsServer;
use rsembed_integration_tests::{
    binary, cli_help, fixture_images, help_has_flag, help_reads_env, http_get,
};
use rsembed_worker::http::{HEALTHZ_PATH, METRICS_PATH, READYZ_PATH};
use rsembed_worker::queue::{parse_duration, QueueConfig};
use serde_json::Value;

/// `helm_render.py` with the named values files of `ci/`.
fn helm(files: &[&str], set: &Value, stub: bool) -> Result<Value, String> {
    let files: Vec<_> = files.iter().map(|f| values_file(f)).collect();
    rsembed_integration_tests::helm::render(&files, set, stub)
}

/// The binary and subcommand a container runs: the worker image's
/// entrypoint is `rsembed-worker`, the coordinator image's `rsembed`.
fn command_of(c: &Container) -> (&'static str, Vec<String>) {
    let image = c.image.as_deref().unwrap_or_default();
    let args = c.args.clone().unwrap_or_default();
    if image.starts_with("rsembed-worker:") {
        ("rsembed-worker", Vec::new())
    } else {
        assert!(image.starts_with("rsembed:"), "unexpected image {image}");
        let sub = args
            .first()
            .cloned()
            .expect("rsembed containers name a subcommand");
        ("rsembed", vec![sub])
    }
}

/// Every flag a container passes, and every `RSEMBED_*` variable it sets, is
/// one its binary has.
fn flags_and_env_exist(r: &Render) {
    let mut helps: BTreeMap<(&str, Vec<String>), String> = BTreeMap::new();
    for (pod_name, pod) in r.pods() {
        for c in all_containers(pod) {
            let (bin, sub) = command_of(c);
            let help = helps.entry((bin, sub.clone())).or_insert_with(|| {
                let sub: Vec<&str> = sub.iter().map(String::as_str).collect();
                cli_help(&binary(bin), &sub)
            });
            for flag in c.args.iter().flatten().filter(|a| a.starts_with("--")) {
                assert!(
                    help_has_flag(help, flag),
                    "{}: {pod_name}/{}: {bin} {sub:?} has no {flag}",
                    r.name,
                    c.name
                );
            }
            for e in c
                .env
                .iter()
                .flatten()
                .filter(|e| e.name.starts_with("RSEMBED_"))
            {
                // Read by every command through the logging setup, not a flag.
                if e.name == "RSEMBED_LOG" {
                    continue;
                }
                // The job's containers share one environment: each reads its part.
                let shared = pod_name == "job";
                assert!(
                    help_reads_env(help, &e.name) || shared && job_reads(&e.name),
                    "{}: {pod_name}/{}: {bin} {sub:?} reads no {}",
                    r.name,
                    c.name,
                    e.name
                );
            }
        }
    }
}

/// A variable of the job's shared environment is read by one of its steps.
fn job_reads(var: &str) -> bool {
    static HELPS: OnceLock<Vec<String>> = OnceLock::new();
    HELPS
        .get_or_init(|| {
            ["submit", "status", "finalize"]
                .iter()
                .map(|sub| cli_help(&binary("rsembed"), &[sub]))
                .collect()
        })
        .iter()
        .any(|help| help_reads_env(help, var))
}

/// Secret references resolve: to a Secret the chart renders (and then to one
/// of its keys), or to an existing Secret the values name. Files read from
/// Secret volumes are under a mount of that volume.
fn secrets_resolve(r: &Render) {
    let rendered = r.rendered_secrets();
    let existing = r.existing_secrets();
    let known = |name: &str, key: Option<&str>, at: &str| {
        if let Some(keys) = rendered.get(name) {
            if let Some(k) = key {
                assert!(
                    keys.contains(k),
                    "{}: {at}: Secret {name} has no key {k}",
                    r.name
                );
            }
        } else {
            assert!(
                existing.contains(name),
                "{}: {at}: Secret {name} is neither rendered nor named in the values ({existing:?})",
                r.name
            );
        }
    };
    for (pod_name, pod) in r.pods() {
        let volumes: BTreeMap<&str, &k8s_openapi::api::core::v1::Volume> = pod
            .volumes
            .iter()
            .flatten()
            .map(|v| (v.name.as_str(), v))
            .collect();
        for v in volumes.values() {
            if let Some(s) = &v.secret {
                let name = s
                    .secret_name
                    .as_deref()
                    .expect("secret volumes name a Secret");
                known(name, None, &format!("{pod_name} volume {}", v.name));
            }
        }
        for c in all_containers(pod) {
            let at = format!("{pod_name}/{}", c.name);
            for e in c.env.iter().flatten() {
                if let Some(k) = e
                    .value_from
                    .as_ref()
                    .and_then(|f| f.secret_key_ref.as_ref())
                {
                    known(&k.name, Some(&k.key), &format!("{at} {}", e.name));
                }
            }
            for f in c.env_from.iter().flatten() {
                if let Some(s) = &f.secret_ref {
                    known(&s.name, None, &format!("{at} envFrom"));
                }
            }
            let mut mounted = Vec::new();
            for m in c.volume_mounts.iter().flatten() {
                let v = volumes
                    .get(m.name.as_str())
                    .unwrap_or_else(|| panic!("{}: {at} mounts unknown volume {}", r.name, m.name));
                mounted.push((m.mount_path.as_str(), *v));
            }
            // Files the NATS flags read must come from a Secret volume.
            for var in [
                "RSEMBED_NATS_CREDS",
                "RSEMBED_NATS_NKEY",
                "RSEMBED_NATS_TLS_CA",
                "RSEMBED_NATS_TLS_CERT",
                "RSEMBED_NATS_TLS_KEY",
            ] {
                let Some(path) = env(c, var) else { continue };
                let ok = mounted.iter().any(|(dir, v)| {
                    v.secret.is_some()
                        && path
                            .strip_prefix(dir)
                            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1)
                });
                assert!(
                    ok,
                    "{}: {at}: {var}={path} is not in a mounted Secret",
                    r.name
                );
            }
        }
    }
}

/// Probes use the worker's real endpoints on its HTTP port.
fn probes(r: &Render) {
    let pod = pod_spec_of_deployment(r.deployment());
    let worker = pod
        .containers
        .iter()
        .find(|c| c.name == "worker")
        .expect("worker");
    let addr = env(worker, "RSEMBED_HTTP_ADDR").expect("the worker serves HTTP");
    let port: i32 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let http = worker
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("http"))
        .expect("a port named http");
    assert_eq!(
        http.container_port, port,
        "{}: port http is not the HTTP address",
        r.name
    );
    let path = |p: &Option<k8s_openapi::api::core::v1::Probe>| {
        let get = p
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("HTTP probes");
        assert_eq!(
            serde_json::to_value(&get.port).unwrap(),
            "http",
            "{}: probes use the named port",
            r.name
        );
        get.path.clone().unwrap_or_default()
    };
    assert_eq!(
        path(&worker.startup_probe),
        READYZ_PATH,
        "{}: startup",
        r.name
    );
    assert_eq!(
        path(&worker.readiness_probe),
        READYZ_PATH,
        "{}: readiness",
        r.name
    );
    assert_eq!(
        path(&worker.liveness_probe),
        HEALTHZ_PATH,
        "{}: liveness",
        r.name
    );

    for m in &r.manifests {
        let eps = match m {
            Manifest::PodMonitor(p) => &p.spec.pod_metrics_endpoints,
            Manifest::ServiceMonitor(s) => &s.spec.endpoints,
            _ => continue,
        };
        for e in eps {
            assert_eq!(
                e.path.as_deref(),
                Some(METRICS_PATH),
                "{}: metrics path",
                r.name
            );
            assert_eq!(e.port.as_deref(), Some("http"), "{}: metrics port", r.name);
        }
    }
    if let Some(svc) = r.manifests.iter().find_map(|m| match m {
        Manifest::Service(s) => Some(s),
        _ => None,
    }) {
        let spec = svc.spec.as_ref().unwrap();
        let labels = &pod_template_labels(r.deployment());
        for (k, v) in spec.selector.iter().flatten() {
            assert_eq!(
                labels.get(k),
                Some(v),
                "{}: the Service selects the workers",
                r.name
            );
        }
    }
}

fn pod_template_labels(d: &Deployment) -> BTreeMap<String, String> {
    d.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

/// The worker: one GPU per pod (or none on CPU), the device to match, a
/// termination grace above the drain grace, the model mounted where
/// RSEMBED_MODEL says, and the hardening every container gets.
fn worker(r: &Render) {
    let d = r.deployment();
    let pod = pod_spec_of_deployment(d);
    let worker = pod
        .containers
        .iter()
        .find(|c| c.name == "worker")
        .expect("worker");
    let gpu = r.value("/worker/gpu/enabled") == true;
    let resource = r.value("/worker/gpu/resourceName").as_str().unwrap();
    let limits = worker
        .resources
        .as_ref()
        .and_then(|res| res.limits.clone())
        .unwrap_or_default();
    if gpu {
        assert_eq!(
            limits.get(resource).map(|q| q.0.as_str()),
            Some("1"),
            "{}: one {resource} per worker",
            r.name
        );
        assert_eq!(env(worker, "RSEMBED_DEVICE"), Some("cuda"));
    } else {
        assert!(
            !limits.keys().any(|k| k.contains("gpu")),
            "{}: a CPU worker asks for a GPU",
            r.name
        );
        assert_eq!(env(worker, "RSEMBED_DEVICE"), Some("cpu"));
        assert!(pod.tolerations.as_ref().is_none_or(|t| t.is_empty()));
    }
    let grace = parse_duration(env(worker, "RSEMBED_SHUTDOWN_GRACE").expect("a drain grace"))
        .expect("a duration");
    let kill = pod
        .termination_grace_period_seconds
        .expect("a termination grace");
    assert!(
        Duration::from_secs(kill as u64) > grace,
        "{}: terminationGracePeriodSeconds {kill} is not above --shutdown-grace {grace:?}",
        r.name
    );
    match r.scaled_object() {
        Some(_) => assert!(
            d.spec.as_ref().unwrap().replicas.is_none(),
            "KEDA owns replicas"
        ),
        None => assert!(d.spec.as_ref().unwrap().replicas.is_some()),
    }
    for (pod_name, pod) in r.pods() {
        for c in all_containers(pod) {
            let at = format!("{}: {pod_name}/{}", r.name, c.name);
            let sc = c
                .security_context
                .as_ref()
                .unwrap_or_else(|| panic!("{at}: no securityContext"));
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{at}");
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{at}");
            let pod_sc = pod
                .security_context
                .as_ref()
                .expect("a pod securityContext");
            assert_eq!(pod_sc.run_as_non_root, Some(true), "{at}");
            if let Some(dir) = env(c, "RSEMBED_MODEL") {
                let m = c
                    .volume_mounts
                    .iter()
                    .flatten()
                    .find(|m| m.mount_path == dir)
                    .unwrap_or_else(|| panic!("{at}: RSEMBED_MODEL={dir} is not mounted"));
                assert_eq!(m.name, "model", "{at}");
            }
        }
        let fetch = pod
            .init_containers
            .iter()
            .flatten()
            .find(|c| c.name == "fetch-model");
        match r.value("/model/source").as_str() {
            Some("objectStore") => {
                let f = fetch.unwrap_or_else(|| panic!("{}: {pod_name}: no fetch-model", r.name));
                let args = f.args.clone().unwrap();
                let url = r.value("/model/objectStore/url").as_str().unwrap();
                assert_eq!(
                    args,
                    [
                        "fetch-model",
                        "--from",
                        url,
                        "--to",
                        &format!("/models/{}", r.value("/model/name").as_str().unwrap())
                    ]
                );
            }
            _ => assert!(fetch.is_none()),
        }
    }
}

/// The Job: submit, then watch, then finalize, in one pod that retries as a
/// whole, with a deadline and a TTL; exit 3 of finalize ends it.
fn job(r: &Render) {
    let Some(job) = r.job() else {
        assert!(
            r.value("/job/enabled") != true,
            "{}: job.enabled renders no Job",
            r.name
        );
        return;
    };
    let spec = job.spec.as_ref().unwrap();
    assert!(spec.backoff_limit.is_some() && spec.active_deadline_seconds.is_some());
    assert!(spec.ttl_seconds_after_finished.is_some());
    let pod = pod_spec_of_job(job);
    assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    let steps: Vec<(String, Vec<String>)> = all_containers(pod)
        .filter(|c| c.name != "fetch-model")
        .map(|c| (c.name.clone(), c.args.clone().unwrap_or_default()))
        .collect();
    assert_eq!(
        steps.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["submit", "watch", "finalize"],
        "{}",
        r.name
    );
    assert_eq!(steps[0].1[0], "submit");
    assert_eq!(steps[1].1[..2], ["status", "--watch"]);
    assert_eq!(steps[2].1, ["finalize"]);
    let extra: Vec<String> =
        serde_json::from_value(r.value("/job/extraArgs").clone()).unwrap_or_default();
    assert_eq!(
        steps[0].1[1..],
        extra[..],
        "{}: submit gets the job's flags",
        r.name
    );
    let rule = spec
        .pod_failure_policy
        .as_ref()
        .and_then(|p| p.rules.iter().find(|r| r.action == "FailJob"))
        .and_then(|r| r.on_exit_codes.as_ref())
        .expect("finalize's exit 3 fails the Job");
    assert_eq!(rule.container_name.as_deref(), Some("finalize"));
    assert_eq!(rule.values, [3]);
    let finalize = pod
        .containers
        .iter()
        .find(|c| c.name == "finalize")
        .unwrap();
    for (var, pointer) in [
        ("RSEMBED_INPUT", "/job/input"),
        ("RSEMBED_OUTPUT", "/job/output"),
    ] {
        assert_eq!(
            env(finalize, var),
            r.value(pointer).as_str(),
            "{}: {var}",
            r.name
        );
    }
}

/// Every rsembed container reaches the same NATS; KEDA watches the stream
/// and consumer rsembed uses, on that NATS's monitoring endpoint.
fn nats(r: &Render) {
    let in_chart = r.value("/nats/enabled") == true;
    let url = match r.value("/queue/url").as_str() {
        Some(u) if !u.is_empty() => u.to_owned(),
        _ => {
            assert!(in_chart);
            format!("nats://{RELEASE}-nats.{NAMESPACE}.svc.cluster.local:4222")
        }
    };
    for (pod_name, pod) in r.pods() {
        for c in all_containers(pod).filter(|c| c.name != "fetch-model") {
            assert_eq!(
                env(c, "RSEMBED_NATS"),
                Some(url.as_str()),
                "{}: {pod_name}/{}",
                r.name,
                c.name
            );
        }
    }
    let Some(so) = r.scaled_object() else { return };
    let deployment = r.deployment().metadata.name.as_deref().unwrap();
    assert_eq!(so.spec.scale_target_ref.name, deployment);
    assert_eq!(so.spec.scale_target_ref.kind.as_deref(), Some("Deployment"));
    assert_eq!(
        so.spec.min_replica_count,
        Some(0),
        "{}: scales to zero",
        r.name
    );
    let [t] = &so.spec.triggers[..] else {
        panic!("one trigger")
    };
    assert_eq!(t.type_, "nats-jetstream");
    let q = QueueConfig::default();
    assert_eq!(t.metadata["stream"], q.stream);
    assert_eq!(t.metadata["consumer"], q.consumer);
    assert_eq!(
        t.metadata["account"],
        r.value("/keda/account").as_str().unwrap()
    );
    for k in ["lagThreshold", "activationLagThreshold"] {
        t.metadata[k]
            .parse::<u32>()
            .unwrap_or_else(|_| panic!("{k} is a number"));
    }
    let monitoring = &t.metadata["natsServerMonitoringEndpoint"];
    let expected = match r.value("/queue/monitoringEndpoint").as_str() {
        Some(m) if !m.is_empty() => m.to_owned(),
        _ => format!("{RELEASE}-nats-headless.{NAMESPACE}.svc.cluster.local:8222"),
    };
    assert_eq!(monitoring, &expected, "{}", r.name);
}

fn check(r: &Render) {
    worker(r);
    probes(r);
    secrets_resolve(r);
    flags_and_env_exist(r);
    job(r);
    nats(r);
    let deployment = r.deployment().metadata.name.clone().unwrap();
    assert!(
        r.notes.contains(&deployment),
        "{}: NOTES.txt does not name the workers:\n{}",
        r.name,
        r.notes
    );
}

#[test]
fn default_values() {
    check(&render_ci("default", true));
}

#[test]
fn keda_values() {
    let r = render_ci("keda", true);
    assert!(r.scaled_object().is_some());
    check(&r);
}

#[test]
fn external_nats_tls_values() {
    // No in-chart NATS: this one renders and lints without the stub too.
    for stub in [false, true] {
        let r = render_ci("external-nats-tls", stub);
        assert!(r.scaled_object().is_some());
        check(&r);
    }
}

#[test]
fn cpu_values() {
    check(&render_ci("cpu", true));
}

/// The highly available profile: the NATS chart's 3-node JetStream cluster,
/// and the Job's submit creating the stream and bucket with 3 replicas (what
/// such a queue does under node loss is `tests/cluster3.rs`).
#[test]
fn cluster_values() {
    let r = render_ci("cluster", true);
    assert!(r.scaled_object().is_some());
    check(&r);
    assert_eq!(r.value("/nats/config/cluster/enabled"), true);
    let nodes = r.value("/nats/config/cluster/replicas").as_u64();
    assert_eq!(nodes, Some(3));
    let submit = all_containers(pod_spec_of_job(r.job().expect("a Job")))
        .find(|c| c.name == "submit")
        .expect("a submit step");
    assert_eq!(env(submit, "RSEMBED_STREAM_REPLICAS"), Some("3"));
}

/// Values the chart refuses, each with a message that says what to set.
#[test]
fn refused_values() {
    let cases = [
        (vec![], Value::Null, "model.objectStore.url is required"),
        (
            vec!["default"],
            serde_json::json!({"nats": {"enabled": false}}),
            "queue.url is required",
        ),
        (
            vec!["default"],
            serde_json::json!({"job": {"enabled": true}}),
            "/job/input",
        ),
        (
            vec!["default"],
            serde_json::json!({"worker": {"shutdownGraceSeconds": 300}}),
            "must be greater than worker.shutdownGraceSeconds",
        ),
        (
            vec!["default"],
            serde_json::json!({"queue": {"auth": {"type": "token"}}}),
            "queue.auth.existingSecret is required",
        ),
        (
            vec!["default"],
            serde_json::json!({"worker": {"gpu": {"count": 2}}}),
            "additional properties 'count' not allowed",
        ),
        (
            vec!["default"],
            serde_json::json!({"queue": {"ackWait": "1m30s"}}),
            "/queue/ackWait",
        ),
        (
            vec!["keda"],
            serde_json::json!({"nats": {"enabled": false}, "queue": {"url": "nats://n:4222"}}),
            "queue.monitoringEndpoint is required",
        ),
        (
            vec!["default"],
            serde_json::json!({"model": {"source": "pvc"}}),
            "model.pvc.claimName is required",
        ),
    ];
    for (files, set, message) in cases {
        match helm(&files, &set, true) {
            Ok(_) => panic!("{files:?} + {set} rendered; expected {message:?}"),
            Err(e) => assert!(
                e.contains(message),
                "{files:?} + {set}: expected {message:?} in:\n{e}"
            ),
        }
    }
}

/// The names KEDA's scaler reads are the stream and consumer that `rsembed
/// submit` creates, and the lag it computes from the monitoring endpoint
/// (pending + unacknowledged, the scaler's formula) is the job's task count.
#[test]
fn keda_watches_what_submit_creates() {
    let r = render_ci("keda", true);
    let so = r.scaled_object().expect("a ScaledObject");
    let meta = &so.spec.triggers[0].metadata;

    let nats = NatsServer::start();
    let out = tempfile::tempdir().unwrap();
    let summary = submit_ok(
        &nats.url(),
        &fixture_images(),
        out.path(),
        &["--task-files", "1"],
    );
    let tasks = summary["tasks"].as_u64().expect("submit counts tasks");
    assert!(tasks > 1, "{summary}");

    // The URL the scaler builds: /jsz?acc=<account>&consumers=true&config=true
    // (without accounts, NATS's global account is "$G").
    let (status, body) = http_get(
        nats.monitor_port(),
        "/jsz?acc=$G&consumers=true&config=true",
    )
    .expect("the monitoring endpoint answers");
    assert!(status.contains("200"), "{status}: {body}");
    let jsz: Value = serde_json::from_str(&body).expect("/jsz is JSON");
    let account = jsz["account_details"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "$G"))
        .unwrap_or_else(|| panic!("no account $G in {jsz:#}"));
    let stream = account["stream_detail"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["name"] == meta["stream"].as_str()))
        .unwrap_or_else(|| panic!("no stream {} in {account:#}", meta["stream"]));
    let consumer = stream["consumer_detail"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == meta["consumer"].as_str()))
        .unwrap_or_else(|| panic!("no consumer {} in {stream:#}", meta["consumer"]));
    let lag =
        consumer["num_pending"].as_u64().unwrap() + consumer["num_ack_pending"].as_u64().unwrap();
    assert_eq!(lag, tasks, "{consumer:#}");
}
