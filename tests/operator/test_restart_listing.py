"""A restart while the workload Pods are still listing (a big fleet's slow kind): probe
ends are served at once, reservations wait for the complete copy.

The restarted operator talks to the API server through :mod:`sdcdev.faultproxy`, which
holds its list of all Pods unanswered until the test releases it (as a list of
200,000 Pods behind throttling takes a minute). Every other kind lists at once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from kubernetes import client

from sdcdev.cluster.localcluster import LocalCluster, kubeconfig_text
from sdcdev.faultproxy import FaultProxy, FaultRates
from sdcdev.harness import (
    NS,
    OperatorProcess,
    ProbeKubelet,
    create_policy,
    delete_all,
    gpu_nodes,
    gpu_pod,
    list_custom,
    new_case,
    node_state,
    taint_keys,
    trusted_baseline,
    wait_for,
)

QUARANTINE = "sdcguard.dev/quarantined"


def _all_pods_list(path: str, query: Any) -> bool:
    """The copy's list of every workload Pod: a streaming list, or a paged list's pages
    (not a watch from a list's resourceVersion, nor one node's Pods)."""
    streaming = query.get("sendInitialEvents") == "true"
    return (
        path == "/api/v1/pods"
        and (streaming or query.get("watch") not in ("1", "true"))
        and "spec.nodeName" not in query.get("fieldSelector", "")
    )


def _probe_pods(api: client.ApiClient, node: str) -> list[client.V1Pod]:
    pods = client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector="app.kubernetes.io/component=sdcprobe"
    )
    return [p for p in pods.items if p.spec.node_name == node]


def _workload(api: client.ApiClient, ns: str, name: str, node: str) -> None:
    # Tolerates everything, as some DaemonSets do: it lands on a held node.
    client.CoreV1Api(api).create_namespaced_pod(ns, gpu_pod(name, node, tolerate_all=True))


def test_probe_ends_are_served_while_the_pods_list_and_reservations_wait(
    cluster: LocalCluster, crds: None, api_client: client.ApiClient, tmp_path: Path
) -> None:
    case = new_case()
    sick, late = f"sick-{case}", f"late-{case}"
    ns = f"team-{case}"
    core = client.CoreV1Api(api_client)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    trusted_baseline(api_client)
    outcomes = {sick: "never"}
    first = OperatorProcess(cluster.kubeconfig, tmp_path / "first.log").start()
    second: OperatorProcess | None = None
    try:
        with gpu_nodes(api_client, [sick], case=case), ProbeKubelet(api_client, outcomes):
            # The first SDC quarantines (no confirming re-run, whose probe Pod the
            # workload below would keep from the node's GPUs).
            create_policy(api_client, case, confirmation={"reruns": 0})
            wait_for(lambda: list_custom(api_client, "sdctests", sick), 60, "sick's test")
            wait_for(lambda: _probe_pods(api_client, sick), 60, "its probe Pod")
            first.kill()
            # While no operator runs: the probe ends with SDC, a workload lands on the
            # held node, and a new node joins.
            outcomes[sick] = "sdc"
            _workload(api_client, ns, "tolerant", sick)
            with (
                gpu_nodes(api_client, [late], case=case),
                FaultProxy(
                    cluster.server,
                    cluster.ca_file,
                    cluster.token,
                    seed=7,
                    rates=FaultRates.off(),
                    hold=_all_pods_list,
                ) as proxy,
            ):
                kubeconfig = tmp_path / "proxy.kubeconfig"
                kubeconfig.write_text(kubeconfig_text(proxy.url, cluster.ca_file, cluster.token))
                second = OperatorProcess(kubeconfig, tmp_path / "second.log").start()
                wait_for(lambda: node_state(api_client, sick) == "Quarantined", 90, "quarantine")
                assert proxy.injected["held"] >= 1, "the Pods' list was not held"
                assert QUARANTINE in taint_keys(api_client, sick)
                # Its ticket's blast radius has the workload that no copy holds yet.
                [ticket] = wait_for(
                    lambda: list_custom(api_client, "repairtickets", sick), 30, "the ticket"
                )
                names = [w["name"] for w in ticket["spec"]["blastRadius"]["workloads"]]
                assert names == ["tolerant"], ticket["spec"]["blastRadius"]
                # The new node is not reserved from a copy without the Pods.
                time.sleep(3)
                assert list_custom(api_client, "sdctests", late) == []
                assert node_state(api_client, late) is None
                proxy.release()
                wait_for(
                    lambda: list_custom(api_client, "sdctests", late), 60, "late's reservation"
                )
    except Exception:
        for proc in (first, second):
            if proc is not None:
                print(proc.log_path.name, proc.log_tail(80))
        raise
    finally:
        first.stop()
        if second is not None:
            second.stop()
        delete_all(api_client)
        core.delete_namespace(ns)
