//! The Kubernetes manifests (deploy/k8s/): the base and every overlay rendered with
//! `kubectl kustomize`, every object of a core kind validated
//! against the Kubernetes OpenAPI schemas with `kubernetes-validate` (PyPI, in .venv/,
//! strict: an unknown field fails), then what the schemas cannot say: the arena volume is
//! memory-backed at /dev/shm in both containers of the engine Pod, every container has
//! probes and a memory limit and runs as non-root without privilege escalation, every volume
//! mounted exists, the gateway lists each engine replica, the overlays request a GPU, and the
//! InferencePool selects the engine Pods on the port their gateway listens on.
//!
//! Needs `kubectl` 1.21 or later (kustomize v4+ built in; Debian's kubernetes-client is 1.20,
//! too old); without it the test fails unless EDGE_ALLOW_SKIP=1, which reports it skipped by
//! name.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

const NAME: &str = "every_overlay_renders_validates_and_wires_the_engine_pod";
const KUBERNETES_VERSION: &str = "1.30.0";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// `kubectl kustomize dir`, as YAML and as the list of its objects.
fn render(dir: &Path) -> (String, Vec<Value>) {
    let out = Command::new("kubectl").arg("kustomize").arg(dir).output().expect("run kubectl");
    assert!(out.status.success(), "kubectl kustomize {}:\n{}", dir.display(), String::from_utf8_lossy(&out.stderr));
    let yaml = String::from_utf8(out.stdout).unwrap();
    let mut child = Command::new(e2e::python())
        .args(["-c", "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    let json = child.wait_with_output().unwrap();
    assert!(json.status.success(), "YAML to JSON");
    (yaml, serde_json::from_slice(&json.stdout).unwrap())
}

/// `kubernetes-validate --strict` on the objects of core kinds (the CRDs have no schema there).
fn validate_core(objects: &[Value], scratch: &Path, name: &str) {
    let core: Vec<&Value> =
        objects.iter().filter(|o| !o["apiVersion"].as_str().unwrap_or("").contains("inference.networking")).collect();
    let file = scratch.join(format!("{name}.json"));
    for (i, object) in core.iter().enumerate() {
        let path = file.with_extension(format!("{i}.json"));
        std::fs::write(&path, serde_json::to_vec(object).unwrap()).unwrap();
        let out = Command::new(e2e::python())
            .args(["-m", "kubernetes_validate", "--strict", "--kubernetes-version", KUBERNETES_VERSION])
            .arg(&path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {} {} is not valid Kubernetes {KUBERNETES_VERSION}:\n{}{}",
            object["kind"],
            object["metadata"]["name"],
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"].as_array()?.iter().find(|e| e["name"] == name)?["value"].as_str()
}

fn container<'a>(pod: &'a Value, name: &str) -> &'a Value {
    pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

/// What every Pod template must hold, whatever the overlay.
fn check_pod(overlay: &str, owner: &str, pod: &Value) {
    let volumes: Vec<&str> = pod["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{overlay} {owner}");
    let all =
        pod["containers"].as_array().unwrap().iter().chain(pod["initContainers"].as_array().into_iter().flatten());
    for c in all {
        let name = format!("{overlay} {owner}/{}", c["name"]);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL", "{name}");
        for mount in c["volumeMounts"].as_array().into_iter().flatten() {
            let volume = mount["name"].as_str().unwrap();
            assert!(volumes.contains(&volume), "{name} mounts {volume}, which is not a volume of the Pod");
        }
    }
    for c in pod["containers"].as_array().unwrap() {
        let name = format!("{overlay} {owner}/{}", c["name"]);
        assert!(c["readinessProbe"].is_object() || c["livenessProbe"].is_object(), "{name} has probes");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{name} has a memory limit");
    }
}

#[test]
fn every_overlay_renders_validates_and_wires_the_engine_pod() {
    let kubectl = Command::new("kubectl").args(["version", "--client"]).output();
    if !kubectl.is_ok_and(|o| o.status.success()) {
        e2e::skip_or_fail(&format!("{NAME}: kubectl 1.21+ not found (kustomize v4+ is built into it)"));
        return;
    }
    let k8s = repo().join("deploy/k8s");
    let scratch = std::env::temp_dir().join(format!("edge-k8s-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    for (overlay, engines, gpu) in
        [("base", 1, false), ("overlays/thor", 1, true), ("overlays/h200", 2, true), ("llm-d", 2, true)]
    {
        let (yaml, objects) = render(&k8s.join(overlay));
        assert!(!yaml.contains("persistentVolumeClaim: null"), "{overlay}: a patch left a null");
        validate_core(&objects, &scratch, &overlay.replace('/', "-"));

        let engine = find(&objects, "StatefulSet", "edge-engine");
        assert_eq!(engine["spec"]["replicas"], engines, "{overlay}");
        let pod = &engine["spec"]["template"]["spec"];
        check_pod(overlay, "edge-engine", pod);
        // The arena: memory-backed, at /dev/shm in the cache-service and the engine alike.
        let dshm = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "dshm").expect("dshm volume");
        assert_eq!(dshm["emptyDir"]["medium"], "Memory", "{overlay}");
        for name in ["cache-service", "engine"] {
            let mounts = container(pod, name)["volumeMounts"].as_array().unwrap();
            assert!(mounts.iter().any(|m| m["name"] == "dshm" && m["mountPath"] == "/dev/shm"), "{overlay} {name}");
            assert!(mounts.iter().any(|m| m["name"] == "run" && m["mountPath"] == "/run/edge"), "{overlay} {name}");
        }
        let engine_container = container(pod, "engine");
        assert_eq!(engine_container["startupProbe"]["grpc"]["port"], 50051, "{overlay}");
        assert_eq!(
            gpu,
            engine_container["resources"]["limits"]["nvidia.com/gpu"] == 1,
            "{overlay}: a GPU exactly where the overlay is for one"
        );
        if gpu {
            assert_eq!(env(engine_container, "ENGINE_DEVICE"), Some("cuda"), "{overlay}");
        }

        let gateway = find(&objects, "Deployment", "edge-gateway");
        let gateway_pod = &gateway["spec"]["template"]["spec"];
        check_pod(overlay, "edge-gateway", gateway_pod);
        let endpoints = env(container(gateway_pod, "gateway"), "GATEWAY_ENGINE_ENDPOINT").unwrap();
        let expected: Vec<String> = (0..engines).map(|i| format!("http://edge-engine-{i}.edge-engine:50051")).collect();
        assert_eq!(endpoints.split(',').collect::<Vec<_>>(), expected, "{overlay}: the gateway lists every engine");
        let service = find(&objects, "Service", "edge-engine");
        assert_eq!(service["spec"]["clusterIP"], "None", "headless: the replicas' names resolve");

        if overlay == "llm-d" {
            let pool = find(&objects, "InferencePool", "edge");
            assert_eq!(pool["apiVersion"], "inference.networking.k8s.io/v1");
            let selector = pool["spec"]["selector"]["matchLabels"].as_object().unwrap();
            let labels = engine["spec"]["template"]["metadata"]["labels"].as_object().unwrap();
            assert!(selector.iter().all(|(k, v)| labels.get(k) == Some(v)), "the pool selects the engine Pods");
            let port = &pool["spec"]["targetPorts"][0]["number"];
            let sidecar = container(pod, "gateway");
            assert_eq!(&sidecar["ports"][0]["containerPort"], port, "the pool's port is the Pod's gateway");
            assert_eq!(env(sidecar, "GATEWAY_LISTEN"), Some(format!("0.0.0.0:{port}").as_str()));
            assert!(pool["spec"]["endpointPickerRef"]["name"].is_string());
            let objective = find(&objects, "InferenceObjective", "edge-agents");
            assert_eq!(objective["spec"]["poolRef"]["name"], "edge");
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
}
