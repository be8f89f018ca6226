"""A Pod that merely *looks* like a probe Pod must not decide a screening.

Probe results are read from Pods labelled ``app.kubernetes.io/component=sdcprobe`` and
``sdcguard.dev/test=<SDCTest>``. Anyone allowed to create a Pod somewhere can put
those labels on it; its termination message is then whatever that Pod's image
writes. Only the probe Pod of the test's own Job, in the operator's namespace, on
the test's node, may count.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from kubernetes import client

from sdcdev.harness import (
    NS,
    OperatorProcess,
    ProbeKubelet,
    create_policy,
    gpu_nodes,
    list_custom,
    new_case,
    node_state,
    result_message,
    terminated_probe,
    trusted_baseline,
    wait_for,
)


def _running_test(api: client.ApiClient, node: str) -> dict[str, Any] | None:
    for test in list_custom(api, "sdctests", node):
        if (test.get("status") or {}).get("phase") == "Running":
            return test
    return None


def _forge(api: client.ApiClient, namespace: str, node: str, test: str) -> None:
    """A tenant's Pod labelled as the probe of ``test``, ended with a passing result."""
    core = client.CoreV1Api(api)
    probe = wait_for(
        lambda: core.list_namespaced_pod(NS, label_selector=f"sdcguard.dev/test={test}").items,
        30,
        "the real probe Pod",
    )[0]
    args = list(probe.spec.containers[0].args or [])
    checks = tuple(args[args.index("--checks") + 1].split(","))
    code, message = result_message("pass", checks)
    name = f"not-a-probe-{uuid.uuid4().hex[:5]}"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/component": "sdcprobe", "sdcguard.dev/test": test},
            },
            "spec": {
                "nodeName": node,
                "containers": [{"name": "sdcprobe", "image": "example.invalid/echo"}],
            },
        },
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # What the kubelet reports after the tenant's container wrote that message.
    core.patch_namespaced_pod_status(
        name,
        namespace,
        {
            "status": {
                "phase": "Succeeded",
                "containerStatuses": [
                    terminated_probe("example.invalid/echo", code, message, stamp)
                ],
            }
        },
    )


def test_a_labelled_pod_outside_the_operator_namespace_cannot_pass_a_node(
    api_client: client.ApiClient, operator: OperatorProcess
) -> None:
    case = new_case()
    node = f"forge-{case}"
    trusted_baseline(api_client)
    # The real probe never finishes: only the forged result could end the test.
    with gpu_nodes(api_client, [node], case=case), ProbeKubelet(api_client, {node: "never"}):
        policy = create_policy(api_client, case)
        test = wait_for(lambda: _running_test(api_client, node), 60, "a running screening")
        _forge(api_client, "default", node, test["metadata"]["name"])
        # Were the forged end in the operator's copy, two whole full passes (besides the
        # urgent pass a probe's end gets) would have decided the test by it.
        operator.wait_passes(policy, 3)
        phase = (_running_test(api_client, node) or {}).get("status", {}).get("phase")
        assert phase == "Running", "a Pod outside the operator's namespace decided the test"
        assert node_state(api_client, node) == "Testing"


pytestmark = pytest.mark.cluster
