"""Two replicas with leader election, on a control plane of their own whose audit log
records every request of each replica (each has its own ServiceAccount): one acts, the
standby writes nothing until the leader dies, then takes over within the lease."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.cluster.localcluster import LocalCluster, kubeconfig_text
from tests.operator.harness import (
    NS,
    OperatorProcess,
    ProbeKubelet,
    apply_crds,
    create_policy,
    ensure_namespace,
    gpu_nodes,
    new_case,
    node_state,
    trusted_baseline,
    wait_for,
)

# Its own control plane, not the session's: a cluster test all the same.
pytestmark = pytest.mark.cluster

LEASE = "sdcguard-leader"
LEASE_SECONDS = 6
REPLICAS = ("replica-a", "replica-b")
WRITES = frozenset({"create", "update", "patch", "delete", "deletecollection"})
# Reviews of the replica's own permissions are questions, not changes.
NOT_CHANGES = frozenset({"selfsubjectaccessreviews", "selfsubjectrulesreviews"})


@dataclass(frozen=True)
class Write:
    user: str
    at: float
    verb: str
    resource: str
    name: str
    code: int


def _user(replica: str) -> str:
    return f"system:serviceaccount:{NS}:{replica}"


def _audit_policy() -> str:
    users = ", ".join(f'"{_user(r)}"' for r in REPLICAS)
    return (
        "apiVersion: audit.k8s.io/v1\nkind: Policy\n"
        'omitStages: ["RequestReceived"]\n'
        f"rules:\n- level: Metadata\n  users: [{users}]\n- level: None\n"
    )


def _writes(audit_log: Path) -> list[Write]:
    out = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        ref = event.get("objectRef") or {}
        if event.get("verb") not in WRITES or ref.get("resource") in NOT_CHANGES:
            continue
        stamp = event.get("requestReceivedTimestamp") or event["stageTimestamp"]
        out.append(
            Write(
                user=event["user"]["username"],
                at=dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp(),
                verb=event["verb"],
                resource=ref.get("resource", ""),
                name=ref.get("name", ""),
                code=int((event.get("responseStatus") or {}).get("code", 0)),
            )
        )
    return out


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    work = Path(tmp_path_factory.mktemp("standby"))
    (work / "policy.yaml").write_text(_audit_policy())
    audit_log = work / "audit.log"
    args = [
        f"--audit-policy-file={work / 'policy.yaml'}",
        f"--audit-log-path={audit_log}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
    ]
    with LocalCluster(extra_apiserver_args=args) as cluster:
        yield cluster, audit_log


def _replica_kubeconfig(api: client.ApiClient, cluster: LocalCluster, name: str, at: Path) -> Path:
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(NS, {"metadata": {"name": name, "namespace": NS}})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"sdcguard-{name}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": NS}],
        }
    )
    token = core.create_namespaced_service_account_token(
        name, NS, {"spec": {"expirationSeconds": 3600}}
    ).status.token
    at.write_text(kubeconfig_text(cluster.server, cluster.ca_file, token, user=name))
    return at


def _holder(api: client.ApiClient) -> str | None:
    with contextlib.suppress(client.ApiException):
        lease: Any = client.CoordinationV1Api(api).read_namespaced_lease(LEASE, NS)
        return lease.spec.holder_identity or None
    return None


def test_only_the_lease_holder_writes_and_the_standby_takes_over_when_it_dies(
    audited: tuple[LocalCluster, Path], tmp_path: Path
) -> None:
    """Two replicas: the Lease names one, which qualifies a node while the other writes
    nothing at all (the audit log); SIGKILL the leader, and the standby takes the Lease
    within the lease duration (plus a retry) and qualifies a node that joins after."""
    cluster, audit_log = audited
    api = config.new_client_from_config(str(cluster.kubeconfig))
    apply_crds(api)
    ensure_namespace(api)
    env = {
        "SDCGUARD_LEADER_ELECTION": "true",
        "SDCGUARD_LEASE_DURATION_SECONDS": str(LEASE_SECONDS),
        "SDCGUARD_RENEW_DEADLINE_SECONDS": "4",
        "SDCGUARD_RETRY_PERIOD_SECONDS": "1",
    }
    replicas = {
        name: OperatorProcess(
            _replica_kubeconfig(api, cluster, name, tmp_path / f"{name}.kubeconfig"),
            tmp_path / f"{name}.log",
            env={**env, "SDCGUARD_LEADER_IDENTITY": name},
        )
        for name in REPLICAS
    }
    case = new_case()
    first, second = f"lead-{case}", f"next-{case}"
    trusted_baseline(api)
    try:
        for proc in replicas.values():
            proc.start()
        with ProbeKubelet(api, {first: "pass", second: "pass"}):
            create_policy(api, case)
            with gpu_nodes(api, [first], case=case):
                leader = wait_for(lambda: _holder(api), 60, "a replica to take the Lease")
                standby = next(r for r in REPLICAS if r != leader)
                wait_for(lambda: node_state(api, first) == "Qualified", 90, "the leader's work")
                assert _holder(api) == leader
                replicas[leader].kill()
                killed = time.time()
                taken = wait_for(
                    lambda: _holder(api) == standby, 60, "the standby to take the Lease"
                )
                took = time.time() - killed
                assert taken
                with gpu_nodes(api, [second], case=case):
                    wait_for(
                        lambda: node_state(api, second) == "Qualified", 90, "the new leader's work"
                    )
    finally:
        for proc in replicas.values():
            proc.stop()

    # Within the lease (by the standby's own clock it must see the record unchanged
    # that long) plus one retry and the poll above.
    assert took < LEASE_SECONDS + 1 + 2, f"takeover took {took:.1f}s"
    writes = _writes(audit_log)
    mine = {r: [w for w in writes if w.user == _user(r)] for r in REPLICAS}
    assert [w for w in mine[leader] if w.resource != "leases"], "the leader wrote nothing"
    # Before the kill the standby only asked for the Lease (its create lost the race
    # at start, a 409): nothing it sent was accepted, and nothing else was sent.
    early = [
        w for w in mine[standby] if w.at < killed - 0.5 and (w.code < 400 or w.resource != "leases")
    ]
    assert not early, f"the standby wrote while the leader held the Lease: {early[:5]}"
    late = [w for w in mine[leader] if w.at > killed + 0.5]
    assert not late, f"the killed leader wrote after its death: {late[:5]}"
    acted = [w for w in mine[standby] if w.resource not in ("leases", "events")]
    assert acted and any(w.resource == "nodes" and w.name == second for w in acted)
