"""Pure builder of the probe Job for one SDCTest on one node."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sdcguard.api.common import API_VERSION
from sdcguard.api.policy import DEFAULT_PROBE_REQUESTS, ProbeSpec
from sdcguard.domain.devicetaints import TAINT_KEY as DEVICE_TAINT_KEY

TEST_LABEL = "sdcguard.dev/test"
#: The SDCTest's full name; the label holds it only when it fits a label value (63).
TEST_ANNOTATION = "sdcguard.dev/test"
NODE_LABEL = "sdcguard.dev/node"
COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "sdcprobe"
MANAGED_BY = "app.kubernetes.io/managed-by"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
ATTEST_MOUNT_PATH = "/var/run/sdcguard/attest"
"""Where the probe container mounts its per-test attestation Secret."""


@dataclass(frozen=True)
class ProbeTuning:
    """What the policy asks of every screening beyond its checks and budget: the catch
    chance to reach and the memory check's dwell (spec.probe)."""

    catch_target: float
    """--catch-target: the chance every check must reach."""
    catch_fraction: float
    """--catch-fraction: the share of rounds the target's fault is active in."""
    catch_shortfall: str
    """--catch-shortfall: flag (run and report) or refuse (run no check)."""
    memory_dwell_seconds: float | None = None
    """--memory-dwell; None: the probe's default for the device."""

    @classmethod
    def of(cls, probe: ProbeSpec) -> ProbeTuning:
        """The tuning spec.probe states."""
        target = probe.catch_target
        return cls(
            catch_target=target.chance,
            catch_fraction=target.active_fraction,
            catch_shortfall=target.on_shortfall.value.lower(),
            memory_dwell_seconds=probe.memory_dwell_seconds,
        )

    def args(self) -> list[str]:
        """The probe flags for this tuning."""
        args = [
            "--catch-target",
            f"{self.catch_target:g}",
            "--catch-fraction",
            f"{self.catch_fraction:g}",
            "--catch-shortfall",
            self.catch_shortfall,
        ]
        if self.memory_dwell_seconds is not None:
            args += ["--memory-dwell", f"{self.memory_dwell_seconds:g}"]
        return args


@dataclass(frozen=True)
class ProbeJobRequest:
    """Everything the Job needs; built by the handler from the SDCTest and policy."""

    test_name: str
    test_uid: str
    node_name: str
    namespace: str
    image: str
    checks: tuple[str, ...]
    budget_seconds: int
    active_deadline_seconds: int
    ttl_seconds_after_finished: int
    accelerators: tuple[tuple[str, int], ...]
    """Every accelerator resource of the node with its full allocatable count (all of
    a MIG node's profiles), requested so no other Pod shares the node's devices."""
    tolerated_taint_keys: tuple[str, ...]
    dra_claims: tuple[tuple[str, int], ...] = ()
    """A DRA-only node's (DeviceClass, devices) pairs (``NodeFacts.dra_claims``): the
    Pod claims every device of each class through :func:`claim_template_name`."""
    cpu_devices: int | None = None
    seed: int | None = None
    data_seed: int | None = None
    """The screening's own seed for the rounds a baseline does not cover."""
    resources: dict[str, dict[str, str]] = field(default_factory=dict)
    env: tuple[tuple[str, str], ...] = ()
    priority_class: str = ""
    check_params: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    """The container's command (empty: ``python -m sdcprobe``)."""
    extra_args: tuple[str, ...] = ()
    """Added after the arguments sdcguard passes (spec.probe.args)."""
    tuning: ProbeTuning | None = None
    """Catch target and memory dwell (None: the probe's defaults)."""
    tolerations: tuple[Mapping[str, str | int], ...] = ()
    """The policy's tolerations (spec.probe.tolerations), as the Pod spec writes them."""
    image_pull_secrets: tuple[str, ...] = ()
    runtime_class: str = ""
    pod_labels: tuple[tuple[str, str], ...] = ()
    """Extra labels of the Pod (spec.probe.labels); sdcguard's own are kept."""
    pod_annotations: tuple[tuple[str, str], ...] = ()
    attestation_secret: str | None = None
    """The per-test Secret (nonce and key) the probe seals its result with, mounted by
    this Job's Pod alone (None: results are not sealed)."""
    """Extra annotations of the Pod (spec.probe.annotations)."""


RESOURCE_API = "resource.k8s.io/v1"
CLAIM_TEMPLATE_PREFIX = "sdcprobe-"


def claim_template_name(device_class: str) -> str:
    """The ResourceClaimTemplate (in the operator's namespace) through which probe Pods
    claim every device of ``device_class`` on their node."""
    return f"{CLAIM_TEMPLATE_PREFIX}{device_class}"[:253].rstrip(".-")


def build_claim_template(namespace: str, device_class: str) -> dict[str, Any]:
    """A ResourceClaimTemplate asking for every device of ``device_class`` on the node
    the Pod is scheduled to (allocation mode All): the scheduler allocates them all to
    the probe's claim, or does not place it while any of them is someone else's. It
    tolerates sdcguard's own device taint (quarantine scope Device), as the Pod
    tolerates its node taints: a verification screens the quarantined GPU too."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": claim_template_name(device_class),
            "namespace": namespace,
            "labels": {COMPONENT_LABEL: COMPONENT, MANAGED_BY: "sdcguard"},
        },
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": "all",
                            "exactly": {
                                "deviceClassName": device_class,
                                "allocationMode": "All",
                                "tolerations": [{"key": DEVICE_TAINT_KEY, "operator": "Exists"}],
                            },
                        }
                    ]
                }
            }
        },
    }


PROBE_IMAGE_ENV = "SDCPROBE_IMAGE"
"""The probe container's own image reference, which the probe puts in its fingerprint."""


def label_value(text: str) -> str:
    """``text`` as a label value: itself when it fits (63 characters), else a prefix and a
    hash of the whole (autoscalers name nodes up to 253 characters; tests add a suffix)."""
    if len(text) <= 63:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[:52].rstrip('-._')}-{digest}"


def job_name(test_name: str) -> str:
    """The Job is named after its SDCTest, so creating it twice is a 409, not a duplicate.
    A name too long for the Job's ``job-name`` label (63) ends in a hash of the whole, so
    the tests of one node (which differ only at the end) never share a Job."""
    return label_value(f"sdcprobe-{test_name}")


def probe_args(req: ProbeJobRequest) -> list[str]:
    """Arguments of ``python -m sdcprobe run`` for this request."""
    args = [
        "run",
        "--checks",
        ",".join(req.checks),
        "--device",
        "auto",
        "--budget",
        str(req.budget_seconds),
        "--deadline",
        str(req.active_deadline_seconds),
        "--result-file",
        "/dev/termination-log",
    ]
    if req.cpu_devices is not None:
        args += ["--cpu-devices", str(req.cpu_devices)]
    if req.seed is not None:
        args += ["--seed", str(req.seed)]
    if req.data_seed is not None:
        args += ["--data-seed", str(req.data_seed)]
    if req.tuning is not None:
        args += req.tuning.args()
    for key, value in req.check_params:
        args += [f"--{key}", value]
    return [*args, *req.extra_args]


def build_probe_job(req: ProbeJobRequest) -> dict[str, Any]:
    """A batch/v1 Job pinned to one node that runs the probe on all its accelerators.

    - node affinity to exactly this node (not nodeName, so the scheduler still
      checks resources and the Pod shows up as scheduled normally);
    - tolerates only our own taints (gate, testing, quarantine) so it can run on
      a reserved or quarantined node, and nothing else;
    - requests every accelerator of the node so no customer Pod shares it (a DRA-only
      node's: claims every device of its classes, ``build_claim_template``), and CPU and
      memory (the policy's, else ``DEFAULT_PROBE_REQUESTS``) so the Pod is not BestEffort,
      the first one evicted under memory pressure; no CPU or memory limit, so a large
      node's probe is neither throttled nor OOM-killed in the middle of a check;
    - the runtime's default seccomp profile, no privilege escalation, no capabilities;
    - no service-account token, no retries (a failed probe is evidence, not
      something to retry blindly), a deadline and a TTL;
    - ``karpenter.sh/do-not-disrupt`` so Karpenter does not consolidate the node
      mid-test; labels link Job, Pod, SDCTest and node.
    """
    labels = {
        COMPONENT_LABEL: COMPONENT,
        MANAGED_BY: "sdcguard",
        TEST_LABEL: label_value(req.test_name),
        NODE_LABEL: label_value(req.node_name),
    }
    limits: dict[str, str] = dict(req.resources.get("limits", {}))
    requests: dict[str, str] = {
        **DEFAULT_PROBE_REQUESTS,
        **dict(req.resources.get("requests", {})),
    }
    for resource, count in req.accelerators:
        if count > 0:
            limits[resource] = str(count)
            requests[resource] = str(count)
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 10,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {
                                    "key": "metadata.name",
                                    "operator": "In",
                                    "values": [req.node_name],
                                }
                            ]
                        }
                    ]
                }
            }
        },
        # Our own taints, and the cordon (a quarantined node is verified while cordoned),
        # then the policy's (accelerator pool taints and the like).
        "tolerations": [
            {"key": key, "operator": "Exists"}
            for key in sorted({*req.tolerated_taint_keys, UNSCHEDULABLE_TAINT})
        ]
        + [dict(t) for t in req.tolerations],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "fsGroup": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "sdcprobe",
                "image": req.image,
                "command": list(req.command) or ["python", "-m", "sdcprobe"],
                "args": probe_args(req),
                # HOME on the writable /tmp: user 65532 has no home directory and
                # the root filesystem is read-only (torch and triton cache there).
                # SDCPROBE_IMAGE: the image goes into the probe's fingerprint, so
                # another image never borrows this one's baseline.
                "env": [
                    {"name": "HOME", "value": "/tmp"},
                    {"name": PROBE_IMAGE_ENV, "value": req.image},
                ]
                + [{"name": k, "value": v} for k, v in req.env if k != PROBE_IMAGE_ENV],
                "resources": {"limits": limits, "requests": requests},
                "terminationMessagePath": "/dev/termination-log",
                # A probe that dies before it writes its result (a bad flag, a failed
                # import) leaves the kubelet its log's tail instead, so the error that
                # stopped it reaches the SDCTest after the Job is gone.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "volumeMounts": [
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "shm", "mountPath": "/dev/shm"},
                ],
            }
        ],
        # A container's own /dev/shm is 64 MiB; NCCL between the GPUs of a node and
        # torch's worker processes share memory there.
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
        ],
    }
    if req.attestation_secret:
        container = pod_spec["containers"][0]
        container["volumeMounts"].append(
            {"name": "attest", "mountPath": ATTEST_MOUNT_PATH, "readOnly": True}
        )
        container["env"].append({"name": "SDCPROBE_ATTEST_DIR", "value": ATTEST_MOUNT_PATH})
        # Readable by the probe's group (fsGroup) only.
        pod_spec["volumes"].append(
            {
                "name": "attest",
                "secret": {"secretName": req.attestation_secret, "defaultMode": 0o440},
            }
        )
    if req.dra_claims:
        # A DRA-only node: its devices come through claims, one per device class.
        names = [f"dra-{i}" for i in range(len(req.dra_claims))]
        pod_spec["resourceClaims"] = [
            {"name": name, "resourceClaimTemplateName": claim_template_name(device_class)}
            for name, (device_class, _) in zip(names, req.dra_claims, strict=True)
        ]
        pod_spec["containers"][0]["resources"]["claims"] = [{"name": n} for n in names]
    if req.priority_class:
        pod_spec["priorityClassName"] = req.priority_class
    if req.runtime_class:
        pod_spec["runtimeClassName"] = req.runtime_class
    if req.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in req.image_pull_secrets]
    # The policy's extra labels and annotations first: sdcguard's own (which the API
    # refuses in spec.probe) always hold.
    pod_labels = {**dict(req.pod_labels), **labels}
    pod_annotations = {
        **dict(req.pod_annotations),
        "karpenter.sh/do-not-disrupt": "true",
        TEST_ANNOTATION: req.test_name,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(req.test_name),
            "namespace": req.namespace,
            "labels": labels,
            "annotations": {TEST_ANNOTATION: req.test_name},
            # Deleting the SDCTest garbage-collects its Job and Pod.
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "SDCTest",
                    "name": req.test_name,
                    "uid": req.test_uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": req.active_deadline_seconds,
            "ttlSecondsAfterFinished": req.ttl_seconds_after_finished,
            "template": {
                "metadata": {"labels": pod_labels, "annotations": pod_annotations},
                "spec": pod_spec,
            },
        },
    }


def attestation_secret_name(test_name: str) -> str:
    """The per-test attestation Secret's name: the Job's, with a suffix."""
    return f"{job_name(test_name)}-attest"


def build_attestation_secret(
    test_name: str, test_uid: str, namespace: str, data: Mapping[str, str]
) -> dict[str, Any]:
    """The per-test Secret with the screening's nonce and key, owned by its SDCTest
    (deleting the test garbage-collects it, with the Job)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": attestation_secret_name(test_name),
            "namespace": namespace,
            "labels": {
                COMPONENT_LABEL: COMPONENT,
                MANAGED_BY: "sdcguard",
                TEST_LABEL: label_value(test_name),
            },
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "SDCTest",
                    "name": test_name,
                    "uid": test_uid,
                    "controller": True,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "stringData": dict(data),
    }
