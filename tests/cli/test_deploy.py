"""deploy/: manifests parse, pass the Kubernetes models' checks, run commands that exist here, and lint clean."""

import shlex
from pathlib import Path

import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = sorted(DEPLOY.glob("kuberay/*.yaml"))
ALL_YAML = sorted(DEPLOY.rglob("*.yaml"))


def docs(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def test_every_yaml_file_parses():
    assert ALL_YAML, "no deploy files"
    for path in ALL_YAML:
        assert docs(path), path


def test_yamllint_is_clean():
    pytest.importorskip("yamllint", reason="yamllint is in the dev extra")
    from yamllint import linter
    from yamllint.config import YamlLintConfig

    conf = YamlLintConfig(file=str(DEPLOY / ".yamllint.yaml"))
    problems = [f"{p.name}:{e.line}:{e.column} {e.message}" for p in ALL_YAML for e in linter.run(p.read_text(), conf)]
    assert problems == []


def _strict(model_name, data, where):
    """Deserialize into the kubernetes client's model and back; a field the model drops is not in the schema."""
    from kubernetes import client

    api = client.ApiClient()
    # the private deserializer has kept its signature across client versions (the public one has not)
    obj = api._ApiClient__deserialize(data, model_name)
    back = api.sanitize_for_serialization(obj)
    _same(data, back, where)
    return obj


def _same(given, back, where):
    if isinstance(given, dict):
        assert isinstance(back, dict), where
        for k, v in given.items():
            assert k in back, f"{where}.{k}: not a field of the Kubernetes schema"
            _same(v, back[k], f"{where}.{k}")
    elif isinstance(given, list):
        assert len(given) == len(back), where
        for i, (a, b) in enumerate(zip(given, back)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert str(given) == str(back), f"{where}: {given!r} became {back!r}"


RAYJOB_SPEC = {"entrypoint", "shutdownAfterJobFinishes", "ttlSecondsAfterFinished", "activeDeadlineSeconds",
               "submitterPodTemplate", "rayClusterSpec", "runtimeEnvYAML", "submissionMode", "backoffLimit"}
CLUSTER_SPEC = {"rayVersion", "headGroupSpec", "workerGroupSpecs", "enableInTreeAutoscaling", "authOptions"}
HEAD_SPEC = {"serviceType", "rayStartParams", "template"}
WORKER_SPEC = {"groupName", "replicas", "minReplicas", "maxReplicas", "rayStartParams", "template"}


def _rayjob():
    [job] = [d for d in docs(DEPLOY / "kuberay" / "rayjob.yaml") if d["kind"] == "RayJob"]
    return job


def test_rayjob_fields_and_pod_templates_pass_the_schema():
    pytest.importorskip("kubernetes", reason="the kubernetes client is in the dev extra")
    job = _rayjob()
    assert job["apiVersion"] == "ray.io/v1"
    spec = job["spec"]
    assert set(spec) <= RAYJOB_SPEC
    cluster = spec["rayClusterSpec"]
    assert set(cluster) <= CLUSTER_SPEC and set(cluster["headGroupSpec"]) <= HEAD_SPEC
    _strict("V1PodTemplateSpec", spec["submitterPodTemplate"], "submitterPodTemplate")
    _strict("V1PodTemplateSpec", cluster["headGroupSpec"]["template"], "headGroupSpec.template")
    for g in cluster["workerGroupSpecs"]:
        assert set(g) <= WORKER_SPEC
        assert g["minReplicas"] <= g["replicas"] <= g["maxReplicas"]
        _strict("V1PodTemplateSpec", g["template"], f"workerGroupSpecs[{g['groupName']}].template")


def test_plain_kubernetes_objects_pass_the_schema():
    pytest.importorskip("kubernetes", reason="the kubernetes client is in the dev extra")
    checked = []
    for path in MANIFESTS:
        for d in docs(path):
            if d["apiVersion"] in ("v1", "networking.k8s.io/v1"):
                _strict(f"V1{d['kind']}", d, f"{path.name}:{d['kind']}")
                checked.append(d["kind"])
    assert "NetworkPolicy" in checked and "PersistentVolumeClaim" in checked


def test_gpu_worker_groups_for_both_vendors_with_sized_requests():
    cluster = _rayjob()["spec"]["rayClusterSpec"]
    by_vendor = {}
    for g in cluster["workerGroupSpecs"]:
        [c] = g["template"]["spec"]["containers"]
        req, lim = c["resources"]["requests"], c["resources"]["limits"]
        gpu = [k for k in req if k.endswith("/gpu")]
        assert len(gpu) == 1 and req[gpu[0]] == lim[gpu[0]] == g["rayStartParams"]["num-gpus"]
        assert "cpu" in req and "memory" in req
        by_vendor[gpu[0]] = g["groupName"]
    assert set(by_vendor) == {"nvidia.com/gpu", "amd.com/gpu"}


def _templates(job):
    cluster = job["spec"]["rayClusterSpec"]
    return ([("submitter", job["spec"]["submitterPodTemplate"]), ("head", cluster["headGroupSpec"]["template"])]
            + [(g["groupName"], g["template"]) for g in cluster["workerGroupSpecs"]])


def test_the_submitter_can_reach_the_dashboard_and_nothing_else_can():
    """KubeRay's submitter (and the operator) call the dashboard through the head Service: it must listen on the
    pod's address. The Service stays ClusterIP, token auth is on, and a NetworkPolicy admits only the job's pods
    to any port of the head, and the operator to the dashboard port."""
    job = _rayjob()
    cluster = job["spec"]["rayClusterSpec"]
    head = cluster["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and head["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    assert cluster["authOptions"] == {"mode": "token"}
    assert tuple(int(x) for x in cluster["rayVersion"].split(".")[:2]) >= (2, 52)  # Ray's token auth
    assert job["spec"].get("submissionMode", "K8sJobMode") == "K8sJobMode"  # a submitter pod, through the Service
    label = {"app.kubernetes.io/name": "tunefarm"}
    for name, template in _templates(job):  # the policy's selector matches every pod of the job
        assert label.items() <= template["metadata"]["labels"].items(), name
    [policy] = docs(DEPLOY / "kuberay" / "network-policy.yaml")
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == label and spec["policyTypes"] == ["Ingress"]
    peers = [(r["from"], r.get("ports")) for r in spec["ingress"]]
    assert ([{"podSelector": {"matchLabels": label}}], None) in peers
    others = [(f, p) for f, p in peers if f != [{"podSelector": {"matchLabels": label}}]]
    assert all(p == [{"protocol": "TCP", "port": 8265}] for _, p in others), others  # the operator: dashboard only
    for path in MANIFESTS:
        for d in docs(path):
            assert d.get("spec", {}).get("type") not in ("LoadBalancer", "NodePort"), path
    cluster_vm = docs(DEPLOY / "vm" / "cluster.yaml")[0]
    assert all("--dashboard-host=0.0.0.0" not in c for c in cluster_vm["head_start_ray_commands"])


def test_entrypoints_name_modules_and_files_that_exist(repo_root):
    root = Path(repo_root)
    commands = [_rayjob()["spec"]["entrypoint"]]
    for line in (DEPLOY / "vm" / "cluster.yaml").read_text().splitlines():
        if "python -m" in line:
            commands.append(line[line.index("python -m"):].rstrip(" \\"))
    for text in commands:
        argv = shlex.split(text)
        module = argv[argv.index("-m") + 1]
        assert (root / Path(*module.split("."))).with_suffix(".py").exists(), module
        workload = argv[argv.index("-m") + 2]
        assert (root / workload.replace("/opt/tunefarm/", "")).exists(), workload
        from farm.cli.main import build_parser

        build_parser().parse_args(["tune", *argv[argv.index("-m") + 2:]])  # the flags are real


def test_container_recipes_install_the_right_extras():
    cuda = (DEPLOY / "docker" / "Dockerfile.cuda").read_text()
    rocm = (DEPLOY / "docker" / "Dockerfile.rocm").read_text()
    assert "'.[cuda,torch,triton,report]'" in cuda and "FROM nvidia/cuda" in cuda
    assert "'.[rocm,report]'" in rocm and "FROM rocm/" in rocm
