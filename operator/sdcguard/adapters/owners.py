"""Following a Pod's ownerReferences to the object at the top, through the API.

A Pod of a PyTorchJob is owned by the PyTorchJob; a Pod of a JobSet by a Job owned by
the JobSet; a Deployment's by a ReplicaSet owned by the Deployment. The workload
record names the top, which is what a person recognises and rolls back.

Each owner is read once (GET, by its kind's plural found by discovery) and kept in a
bounded cache by uid (owners do not change owners; the least recently used entries go
first). What cannot be followed is said in the result's ``note``, never raised: an
owner that was deleted (404, or a uid that no longer matches), an ownerReference cycle,
an owner the operator may not read (403), a kind the API server does not serve, or a
chain longer than ``MAX_DEPTH``. The top is then the last object that could be read.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import structlog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.adapters.observe import OwnerRef, owner_ref
from sdcguard.domain.blast import TopOwner

log = structlog.get_logger("sdcguard.owners")

MAX_DEPTH = 8
"""Owners followed above a Pod at most (a JobSet's Pod has two)."""
CACHE_SIZE = 8192
"""Owners kept (by uid): enough for a few workloads a node on a fleet of thousands."""


class OwnerResolver:
    """Resolves top owners with a bounded cache (module docstring). Thread-safe."""

    def __init__(self, api: client.ApiClient, cache_size: int = CACHE_SIZE) -> None:
        self.api = api
        self.cache_size = cache_size
        self._parents: OrderedDict[str, tuple[OwnerRef | None, str | None]] = OrderedDict()
        """owner uid -> (its own owner, or None; a note when it could not be read)."""
        self._plurals: dict[str, dict[str, str] | None] = {}
        """apiVersion -> kind -> plural of its namespaced resources (None: not served)."""
        self._lock = threading.Lock()
        self.reads = 0
        """GETs of owners and discovery documents (for tests and the benchmark)."""

    def top(self, namespace: str, pod: str, ref: OwnerRef | None) -> TopOwner:
        """The top owner of Pod ``namespace/pod`` whose own ownerReference is ``ref``."""
        if ref is None:
            return TopOwner(namespace, "Pod", pod, "v1")
        seen: set[str] = set()
        current = ref
        for _ in range(MAX_DEPTH):
            if current.uid and current.uid in seen:
                return _top(namespace, current, f"ownerReference cycle at {_named(current)}")
            if current.uid:
                seen.add(current.uid)
            parent, note = self._parent(namespace, current)
            if note is not None:
                return _top(namespace, current, note)
            if parent is None:
                return _top(namespace, current, None)
            current = parent
        return _top(namespace, current, f"owner chain deeper than {MAX_DEPTH}; stopped here")

    # Reading -------------------------------------------------------------------

    def _parent(self, namespace: str, ref: OwnerRef) -> tuple[OwnerRef | None, str | None]:
        key = f"{namespace}/{ref.uid or ref.kind + '/' + ref.name}"
        with self._lock:
            hit = self._parents.get(key)
            if hit is not None:
                self._parents.move_to_end(key)
                return hit
        found, lasting = self._read(namespace, ref)
        if lasting:  # a failed read (a 5xx, a timeout) is asked again next time
            with self._lock:
                self._parents[key] = found
                while len(self._parents) > self.cache_size:
                    self._parents.popitem(last=False)
        return found

    def _read(
        self, namespace: str, ref: OwnerRef
    ) -> tuple[tuple[OwnerRef | None, str | None], bool]:
        """(its owner, a note), and whether the answer lasts (may be cached)."""
        try:
            plural = self._plural(ref.api_version, ref.kind)
        except (ApiException, OSError) as exc:
            return (None, f"owner {_named(ref)} could not be read ({_why(exc)})"), False
        if plural is None:
            return (
                None,
                f"{_named(ref)}: kind {ref.kind} of {ref.api_version} is not served",
            ), True
        base = "/api/v1" if ref.api_version == "v1" else f"/apis/{ref.api_version}"
        try:
            body = self._get(f"{base}/namespaces/{namespace}/{plural}/{ref.name}")
        except ApiException as exc:
            if exc.status == 404:
                return (None, f"owner {_named(ref)} was deleted"), True
            if exc.status == 403:
                note = f"owner {_named(ref)} could not be read (no permission); stopped here"
                return (None, note), True
            log.warning("owner read failed", owner=_named(ref), status=exc.status)
            return (None, f"owner {_named(ref)} could not be read ({_why(exc)})"), False
        except OSError as exc:
            return (None, f"owner {_named(ref)} could not be read ({_why(exc)})"), False
        meta = body.get("metadata") or {}
        if ref.uid and meta.get("uid") and meta.get("uid") != ref.uid:
            return (None, f"owner {_named(ref)} was deleted (a new object has its name)"), True
        return (owner_ref(meta), None), True

    def _plural(self, api_version: str, kind: str) -> str | None:
        with self._lock:
            known = self._plurals.get(api_version, {})
        if api_version not in self._plurals:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            try:
                doc = self._get(base)
                known = {
                    str(r.get("kind")): str(r.get("name"))
                    for r in doc.get("resources") or []
                    if r.get("namespaced") and "/" not in str(r.get("name"))
                }
            except ApiException as exc:
                if exc.status not in (403, 404):
                    raise  # asked again next time
                known = None
            with self._lock:
                self._plurals[api_version] = known
        return None if known is None else known.get(kind)

    def _get(self, path: str) -> dict[str, Any]:
        self.reads += 1
        param = self.api.param_serialize("GET", path, auth_settings=["BearerToken"])
        response = self.api.call_api(*param, _request_timeout=10)
        response.read()  # type: ignore[no-untyped-call]
        data = self.api.response_deserialize(response, {"200": "object"}).data
        return data if isinstance(data, dict) else {}


def _named(ref: OwnerRef) -> str:
    return f"{ref.kind}/{ref.name}"


def _why(exc: Exception) -> str:
    status = getattr(exc, "status", None)
    return f"HTTP {status}" if status else type(exc).__name__


def _top(namespace: str, ref: OwnerRef, note: str | None) -> TopOwner:
    return TopOwner(namespace, ref.kind, ref.name, ref.api_version, ref.uid or None, note)
