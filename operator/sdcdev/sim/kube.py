"""The simulator's Kubernetes I/O: thin calls on plain JSON, and a list+watch loop.

Requests use the kubernetes client's ApiClient (authentication, TLS,
connection pool) but not its generated models: the simulator reads a few
fields, and model (de)serialisation would cost more CPU than the rest of the
simulator together.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from sdcguard.api.common import GROUP, VERSION

JsonDict = dict[str, Any]
log = structlog.get_logger("sdcdev.sim")

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

TICKET_GROUP = GROUP
TICKET_VERSION = VERSION
TICKET_PLURAL = "repairtickets"
TICKETS_PATH = f"/apis/{TICKET_GROUP}/{TICKET_VERSION}/{TICKET_PLURAL}"
LEASE_NAMESPACE = "kube-node-lease"
_TIMEOUT = (5.0, 30.0)


def status_of(exc: BaseException) -> int | None:
    """HTTP status of an API error, None for anything else (network, ...)."""
    return int(exc.status) if isinstance(exc, ApiException) and exc.status else None


def _read(resp: Any) -> JsonDict:
    try:
        data = resp.data
    finally:
        with contextlib.suppress(Exception):
            resp.release_conn()
    doc = json.loads(data) if data else {}
    if not isinstance(doc, dict):
        raise ValueError(f"expected a JSON object from the API server, got {type(doc).__name__}")
    return doc


class Kube:
    """The API calls the simulator makes, each returning the JSON object.

    Requests go through the ApiClient's authentication and connection pool
    but skip the generated methods: bodies are plain dicts, and the answers
    stay plain JSON.
    """

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client

    def raw(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str | int | bool] | None = None,
        content_type: str = "application/json",
        timeout: tuple[float, float] = _TIMEOUT,
    ) -> Any:
        """The urllib3 response of one request; ApiException on a non-2xx answer."""
        params = [
            (k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()
        ]
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params={"Accept": "application/json", "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api_client.call_api(*request, _request_timeout=timeout)
        if not 200 <= resp.status <= 299:
            resp.read()  # type: ignore[no-untyped-call]
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
        return resp.response

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str | int | bool] | None = None,
        content_type: str = "application/json",
    ) -> JsonDict:
        return _read(self.raw(method, path, body=body, query=query, content_type=content_type))

    # Nodes and leases ---------------------------------------------------
    def create_node(self, body: JsonDict) -> JsonDict:
        return self.request("POST", "/api/v1/nodes", body=body)

    def patch_node(self, name: str, body: JsonDict) -> JsonDict:
        return self.request(
            "PATCH", f"/api/v1/nodes/{name}", body=body, content_type=STRATEGIC_MERGE_PATCH
        )

    def patch_node_status(self, name: str, body: JsonDict) -> None:
        # Strategic merge keys conditions by type, so conditions other
        # components add (the operator's SDCQualified) are left alone.
        self.request(
            "PATCH", f"/api/v1/nodes/{name}/status", body=body, content_type=STRATEGIC_MERGE_PATCH
        )

    def delete_node(self, name: str) -> None:
        self.request("DELETE", f"/api/v1/nodes/{name}")

    def renew_lease(self, node_name: str, node_uid: str, renew_time: str, duration: int) -> None:
        """Renew (or create) the node's Lease in kube-node-lease, like a kubelet."""
        spec = {
            "holderIdentity": node_name,
            "leaseDurationSeconds": duration,
            "renewTime": renew_time,
        }
        leases = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        try:
            self.request(
                "PATCH", f"{leases}/{node_name}", body={"spec": spec}, content_type=MERGE_PATCH
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": node_name,
                    "namespace": LEASE_NAMESPACE,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
                    ],
                },
                "spec": spec,
            }
            self.request("POST", leases, body=body)

    def delete_lease(self, node_name: str) -> None:
        self.request(
            "DELETE",
            f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{node_name}",
        )

    # Pods and namespaces -------------------------------------------------
    def patch_pod_status(self, namespace: str, name: str, body: JsonDict) -> JsonDict:
        # A JSON merge patch replaces lists whole: a container's state moves
        # from running to terminated without leaving both behind.
        return self.request(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{name}/status",
            body=body,
            content_type=MERGE_PATCH,
        )

    def force_delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Delete with grace period 0 (what a kubelet does once containers stopped)."""
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": uid},
        }
        self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body=body)

    def create_pod(self, namespace: str, body: JsonDict) -> JsonDict:
        return self.request("POST", f"/api/v1/namespaces/{namespace}/pods", body=body)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")

    def list_pods(
        self,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[JsonDict]:
        query: dict[str, str | int | bool] = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        path = "/api/v1/pods" if namespace is None else f"/api/v1/namespaces/{namespace}/pods"
        return list(self.request("GET", path, query=query).get("items") or [])

    def ensure_namespace(self, name: str) -> None:
        try:
            self.request("GET", f"/api/v1/namespaces/{name}")
        except ApiException as exc:
            if exc.status != 404:
                raise
            body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
            with contextlib.suppress(ApiException):  # lost a race: fine
                self.request("POST", "/api/v1/namespaces", body=body)

    # RepairTickets --------------------------------------------------------
    def get_ticket(self, name: str) -> JsonDict:
        return self.request("GET", f"{TICKETS_PATH}/{name}")

    def patch_ticket(self, name: str, body: JsonDict) -> JsonDict:
        return self.request("PATCH", f"{TICKETS_PATH}/{name}", body=body, content_type=MERGE_PATCH)


class Relist(Exception):
    """The watch fell too far behind (410 Gone): list again."""


class ListWatch:
    """List, then watch from the list's resourceVersion; relist on 410; retry on errors.

    ``on_sync`` gets the full list (after start and every relist), ``on_event``
    each ADDED/MODIFIED/DELETED. ``stop()`` interrupts a blocked watch.
    """

    def __init__(
        self,
        kube: Kube,
        path: str,
        *,
        on_sync: Callable[[list[JsonDict]], None],
        on_event: Callable[[str, JsonDict], None],
        stop_event: threading.Event,
        watch_timeout: int = 60,
        retry_seconds: float = 2.0,
        missing_retry_seconds: float = 15.0,
        query: Mapping[str, str] | None = None,
    ) -> None:
        self.kube = kube
        self.path = path
        self.what = path
        self.on_sync = on_sync
        self.on_event = on_event
        self.stop_event = stop_event
        self.watch_timeout = watch_timeout
        self.retry_seconds = retry_seconds
        self.missing_retry_seconds = missing_retry_seconds
        self.query = dict(query or {})
        self._resp: Any = None
        self._lock = threading.Lock()
        self.synced = threading.Event()

    def stop(self) -> None:
        self.stop_event.set()
        with self._lock:
            resp = self._resp
        if resp is not None:
            with contextlib.suppress(Exception):
                resp.shutdown()

    def run(self) -> None:
        missing_logged = False
        while not self.stop_event.is_set():
            try:
                doc = self.kube.request("GET", self.path, query=self.query)
                missing_logged = False
                self.on_sync(list(doc.get("items") or []))
                self.synced.set()
                rv = str(doc.get("metadata", {}).get("resourceVersion", ""))
                while not self.stop_event.is_set():
                    rv = self._watch_once(rv)
            except Relist:
                continue
            except ApiException as exc:
                if exc.status == 404:
                    if not missing_logged:
                        log.warning(
                            "sim.watch.resource_missing",
                            what=self.what,
                            retry_seconds=self.missing_retry_seconds,
                            hint="install the CRD; the simulator keeps retrying",
                        )
                        missing_logged = True
                    self.stop_event.wait(self.missing_retry_seconds)
                    continue
                log.warning("sim.watch.error", what=self.what, status=exc.status, reason=exc.reason)
                self.stop_event.wait(self.retry_seconds)
            except Exception as exc:  # network trouble, server restart: retry
                if self.stop_event.is_set():
                    return
                log.warning("sim.watch.error", what=self.what, error=repr(exc)[:300])
                self.stop_event.wait(self.retry_seconds)

    def _watch_once(self, rv: str) -> str:
        query: dict[str, str | int | bool] = {
            **self.query,
            "watch": True,
            "resourceVersion": rv,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout,
        }
        resp = self.kube.raw(
            "GET", self.path, query=query, timeout=(5.0, self.watch_timeout + 15.0)
        )
        with self._lock:
            self._resp = resp
        try:
            for line in _lines(resp):
                if self.stop_event.is_set():
                    break
                if not line:
                    continue
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise Relist()
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                new_rv = obj.get("metadata", {}).get("resourceVersion")
                if new_rv:
                    rv = str(new_rv)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.on_event(str(kind), obj)
        finally:
            with self._lock:
                self._resp = None
            with contextlib.suppress(Exception):
                resp.release_conn()
        return rv


def _lines(resp: Any) -> Iterable[str]:
    result: Iterable[str] = iter_resp_lines(resp)  # type: ignore[no-untyped-call]
    return result


def retry_call(fn: Callable[[], Any], *, what: str, attempts: int = 3, delay: float = 0.5) -> bool:
    """Call ``fn``; retry transient failures (conflicts, 5xx, network). True if it succeeded."""
    for attempt in range(attempts):
        try:
            fn()
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status not in (409, 429, 500, 502, 503, 504) or attempt == attempts - 1:
                log.warning("sim.api.error", what=what, status=exc.status, reason=exc.reason)
                return False
        except Exception as exc:
            if attempt == attempts - 1:
                log.warning("sim.api.error", what=what, error=repr(exc)[:300])
                return False
        time.sleep(delay * (attempt + 1))
    return False
