"""Kubernetes I/O: the only place that sends requests.

Every mutating call goes through :class:`KubeWriter`, which counts writes by
kind (a metric and a per-pass counter), honours ``dry_run``, and turns a
409 AlreadyExists on create into "already there" so a restart never duplicates
(:func:`already_exists`).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.api import GROUP, VERSION
from sdcguard.domain.echo import bounded
from sdcguard.domain.observed import NODECLAIM_API_VERSION
from sdcguard.metrics import Metrics

FIELD_MANAGER = "sdcguard"
log = structlog.get_logger("sdcguard.kube")


def already_exists(exc: ApiException) -> bool:
    """A create refused because the name is taken (409 with reason AlreadyExists).

    Any other 409 (a conflict a proxy or webhook answered, an object being deleted
    under that name) means nothing was created: it is raised and the next pass tries
    again, rather than waiting for an object that is not there (a probe Job taken for
    created would be given up only after the probe's vanishing grace, minutes later)."""
    if exc.status != 409:
        return False
    try:
        reason = json.loads(exc.body or "{}").get("reason")
    except (ValueError, AttributeError, TypeError):
        return False
    return bool(reason == "AlreadyExists")


CONNECTIONS = 16
"""Connections the writer's client keeps open: the workload records' flush writes eight
nodes at once beside a pass's own writes (the client's default, five a CPU, would be
ten on two cores and drop connections it cannot keep)."""


def make_api_client() -> client.ApiClient:
    """In-cluster credentials inside a Pod, else the kubeconfig (KUBECONFIG or ~/.kube)."""
    import os

    from kubernetes import config

    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()  # type: ignore[no-untyped-call]
        cfg = client.Configuration.get_default_copy()
        cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, CONNECTIONS)
        return client.ApiClient(cfg)
    cfg = client.Configuration()
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, CONNECTIONS)
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        client_configuration=cfg
    )
    return api


class NotLeading(RuntimeError):
    """A write from a replica that does not hold the leader Lease (never sent)."""


@dataclass
class KubeWriter:
    """All writes the operator makes, counted and dry-run aware."""

    api: client.ApiClient
    metrics: Metrics
    dry_run: bool = False
    writes: Counter[str] = field(default_factory=Counter)
    leading: Callable[[], bool] | None = None
    """With leader election: whether this replica holds the Lease now. Every write is
    refused (:class:`NotLeading`) while it does not (``runtime/leader.py``)."""

    def __post_init__(self) -> None:
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.resource = client.ResourceV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        # The pass, the ticket announcer's workers and a pass's parallel hardware
        # writes count through one writer.
        self._counting = threading.Lock()

    def _count(self, kind: str) -> bool:
        """Record one write; returns False in dry-run (caller must not send). Raises
        :class:`NotLeading` when a replica that lost its Lease tries to write."""
        if self.leading is not None and not self.leading():
            raise NotLeading(f"{kind} refused: this replica does not hold the leader Lease")
        with self._counting:
            self.writes[kind] += 1
        self.metrics.api_writes.labels(kind=kind).inc()
        if self.dry_run:
            log.info("dry-run: skipped write", kind=kind)
            return False
        return True

    def allow(self, kind: str) -> bool:
        """Count one write of ``kind`` made elsewhere; False in dry-run (do not send)."""
        return self._count(kind)

    # Nodes ---------------------------------------------------------------

    def patch_node(self, name: str, patch: dict[str, Any]) -> None:
        """Merge-patch a Node. Include ``metadata.resourceVersion`` in the patch
        when replacing lists (taints): the server then rejects a stale write
        with 409 instead of dropping someone else's taint."""
        if self._count("node-patch"):
            self.core.patch_node(name, patch, field_manager=FIELD_MANAGER)

    def patch_node_status(self, name: str, patch: dict[str, Any]) -> None:
        """Strategic-merge-patch a Node's status: conditions merge by ``type``, so the
        kubelet's (Ready and the pressures) and other components' stay as they are."""
        if self._count("node-status-patch"):
            self.core.patch_node_status(name, patch, field_manager=FIELD_MANAGER)

    def may(self, verb: str, resource: str, group: str = "") -> bool | None:
        """Whether this ServiceAccount may ``verb`` ``resource`` (cluster-wide), from a
        SelfSubjectAccessReview; None when the review could not be asked."""
        review = client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, group=group
                )
            )
        )
        try:
            answer = client.AuthorizationV1Api(
                self.core.api_client
            ).create_self_subject_access_review(review)
        except Exception as exc:  # a dropped connection, an old API server
            log.warning("access review failed", verb=verb, resource=resource, error=str(exc)[:200])
            return None
        return bool(answer.status and answer.status.allowed)

    def delete_node(self, name: str, node_claim: str | None = None) -> None:
        """Delete the Node; a Node that Karpenter launched is replaced by deleting its
        NodeClaim (Karpenter then drains and deletes the Node and the instance). A
        NodeClaim that is gone already, or that the operator may not delete, falls back
        to deleting the Node, which Karpenter's termination handles the same way."""
        if node_claim is not None:
            if not self._count("nodeclaim-delete"):
                return
            try:
                group, version = NODECLAIM_API_VERSION.split("/")
                self.custom.delete_cluster_custom_object(group, version, "nodeclaims", node_claim)
                log.info("nodeclaim deleted", node=name, nodeclaim=node_claim)
                return
            except ApiException as exc:
                if exc.status not in (403, 404):
                    raise
                log.warning(
                    "nodeclaim not deleted; deleting the node",
                    node=name,
                    nodeclaim=node_claim,
                    status=exc.status,
                )
        if self._count("node-delete"):
            try:
                self.core.delete_node(name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    # Jobs ------------------------------------------------------------------

    def _create_namespaced(
        self, counter: str, create: Callable[..., Any], manifest: dict[str, Any]
    ) -> bool:
        """Create one namespaced object; False when it already exists (409)."""
        if not self._count(counter):
            return True
        try:
            create(manifest["metadata"]["namespace"], manifest)  # a dict body is accepted as is
        except ApiException as exc:
            if already_exists(exc):
                return False
            raise
        return True

    def create_job(self, manifest: dict[str, Any]) -> bool:
        """Create a Job; returns False when it already exists (409 AlreadyExists)."""
        return self._create_namespaced("job-create", self.batch.create_namespaced_job, manifest)

    def create_secret(self, manifest: dict[str, Any]) -> bool:
        """Create a Secret (a screening's attestation); False when it already exists.
        The operator never reads such a Secret back: it derives what it holds."""
        return self._create_namespaced(
            "secret-create", self.core.create_namespaced_secret, manifest
        )

    def create_claim_template(self, manifest: dict[str, Any]) -> bool:
        """Create a ResourceClaimTemplate (a DRA-only node's probe claims); False when
        it already exists."""
        return self._create_namespaced(
            "claim-template-create",
            self.resource.create_namespaced_resource_claim_template,
            manifest,
        )

    def delete_job(self, namespace: str, name: str) -> None:
        if self._count("job-delete"):
            try:
                self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
            except ApiException as exc:
                if exc.status != 404:
                    raise

    # Custom resources -------------------------------------------------------

    def create_custom(self, plural: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create a cluster-scoped custom object; None when the name is taken."""
        if not self._count(f"{plural}-create"):
            return body
        try:
            created = self.custom.create_cluster_custom_object(
                GROUP, VERSION, plural, body, field_manager=FIELD_MANAGER
            )
        except ApiException as exc:
            if already_exists(exc):
                return None
            raise
        return created if isinstance(created, dict) else body

    def patch_custom_status(self, plural: str, name: str, status: dict[str, Any]) -> None:
        if self._count(f"{plural}-status"):
            self.custom.patch_cluster_custom_object_status(
                GROUP, VERSION, plural, name, {"status": status}
            )

    def delete_custom(self, plural: str, name: str) -> None:
        """Delete a cluster-scoped custom object; one already gone is fine."""
        if self._count(f"{plural}-delete"):
            try:
                self.custom.delete_cluster_custom_object(GROUP, VERSION, plural, name)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    def patch_custom(self, plural: str, name: str, patch: dict[str, Any]) -> None:
        if self._count(f"{plural}-patch"):
            self.custom.patch_cluster_custom_object(GROUP, VERSION, plural, name, patch)

    # Events ----------------------------------------------------------------

    def event(
        self,
        *,
        kind: str,
        name: str,
        uid: str | None,
        reason: str,
        message: str,
        now: dt.datetime,
        warning: bool = False,
        api_version: str = "v1",
        namespace: str = "default",
        namespaced: bool = False,
    ) -> None:
        """A core/v1 Event about an object, as ``kubectl describe`` shows them.

        ``namespaced``: the object lives in ``namespace`` (cluster-scoped objects'
        Events go to ``namespace`` with no namespace on the reference)."""
        if not self._count("event"):
            return
        stamp = now.astimezone(dt.UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(
                name=f"{name}.{uuid.uuid4().hex[:12]}", namespace=namespace
            ),
            involved_object=client.V1ObjectReference(
                kind=kind,
                name=name,
                uid=uid,
                api_version=api_version,
                namespace=namespace if namespaced else None,
            ),
            reason=reason,
            message=bounded(message),
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component="sdcguard"),
            reporting_component="sdcguard.dev/operator",
            reporting_instance="sdcguard",
            first_timestamp=stamp,
            last_timestamp=stamp,
            count=1,
        )
        try:
            self.core.create_namespaced_event(namespace, body)
        except ApiException as exc:  # an Event is never worth failing a transition
            log.warning("event not recorded", reason=reason, name=name, status=exc.status)

    def evict_pods_on_node(
        self, node: str, skip_namespaces: tuple[str, ...] = ()
    ) -> EvictionResult:
        """Evict the node's workload pods (not DaemonSet or mirror pods) through the
        Eviction API, so PodDisruptionBudgets are respected. Never raises for one pod:
        a refusal (429, a PodDisruptionBudget) or an error is counted, and the caller
        tries again later."""
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        asked = blocked = failed = 0
        for pod in pods:
            meta, status = pod.metadata, pod.status
            if meta is None or not meta.name or not meta.namespace:
                continue
            owners = meta.owner_references or []
            if any(o.kind == "DaemonSet" for o in owners) or meta.namespace in skip_namespaces:
                continue
            if "kubernetes.io/config.mirror" in (meta.annotations or {}):
                continue
            if meta.deletion_timestamp is not None:
                continue  # already leaving
            if status is not None and status.phase in ("Succeeded", "Failed"):
                continue
            if not self._count("pod-eviction"):
                continue
            try:
                self.core.create_namespaced_pod_eviction(
                    meta.name,
                    meta.namespace,
                    client.V1Eviction(
                        metadata=client.V1ObjectMeta(name=meta.name, namespace=meta.namespace)
                    ),
                )
                asked += 1
            except ApiException as exc:
                if exc.status == 404:
                    continue
                if exc.status == 429:
                    blocked += 1
                else:
                    failed += 1
                    log.warning(
                        "eviction failed", pod=f"{meta.namespace}/{meta.name}", status=exc.status
                    )
        return EvictionResult(asked=asked, blocked=blocked, failed=failed)


@dataclass(frozen=True)
class EvictionResult:
    """Pods asked to leave, refused by a PodDisruptionBudget (429), and failed otherwise."""

    asked: int = 0
    blocked: int = 0
    failed: int = 0

    @property
    def done(self) -> bool:
        """Every workload pod has been asked to leave."""
        return not (self.blocked or self.failed)
