"""Whether the policy's probe RuntimeClass exists (``spec.probe.runtimeClassName``).

A Pod naming a RuntimeClass that does not exist is refused at admission, so a probe
Job on a reserved node would create no Pod until its deadline: the node would stay
reserved for nothing. The pass asks here first, and a node whose probe could not run
waits (``RuntimeClassMissing``) without being reserved. The answer is kept for
``RECHECK``, so a pass costs at most one read per policy's class and minute.
"""

from __future__ import annotations

import datetime as dt

import structlog
import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

log = structlog.get_logger("sdcguard.reconcile")

RECHECK = dt.timedelta(seconds=60)


class RuntimeClasses:
    """Answers whether a RuntimeClass exists, from a read of ``node.k8s.io/v1``."""

    def __init__(self, api: client.ApiClient) -> None:
        self._node = client.NodeV1Api(api)
        self._seen: dict[str, tuple[dt.datetime, bool]] = {}
        self._told: set[str] = set()

    def missing(self, name: str | None, now: dt.datetime) -> bool:
        """True only when the API server says the RuntimeClass ``name`` does not exist;
        a read that fails otherwise (403, timeout) is logged once and blocks nothing
        (the probe Job's own failure then says so)."""
        if not name:
            return False
        cached = self._seen.get(name)
        if cached is not None and now - cached[0] < RECHECK:
            return not cached[1]
        try:
            self._node.read_runtime_class(name)
            exists = True
        except ApiException as exc:
            if exc.status != 404:
                self._tell(name, f"status {exc.status}")
                return False
            exists = False
        except (OSError, ValueError, urllib3.exceptions.HTTPError) as exc:
            self._tell(name, type(exc).__name__)
            return False
        self._seen[name] = (now, exists)
        return not exists

    def _tell(self, name: str, why: str) -> None:
        if name not in self._told:
            self._told.add(name)
            log.warning("cannot read the probe's RuntimeClass", name=name, error=why)
