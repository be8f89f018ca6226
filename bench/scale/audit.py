"""Counting the operator's API requests from the API server's audit log.

The operator runs under its own ServiceAccount token (a standby replica under
another), and the audit policy logs (at Metadata level) only those users' requests,
so every line is one request an operator replica made. Lines are read incrementally;
each request is counted once (by audit ID), with its verb, resource, subresource,
name, user and time.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

OPERATOR_NS = "sdcguard-system"
OPERATOR_SA = "sdcguard-operator"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NS}:{OPERATOR_SA}"
STANDBY_SA = "sdcguard-standby"
"""A second replica's own ServiceAccount: the audit log tells the two replicas apart."""
STANDBY_USER = f"system:serviceaccount:{OPERATOR_NS}:{STANDBY_SA}"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
NODE_IN_NAME = re.compile(r"gpu-\d{5}")


def policy_yaml(users: tuple[str, ...] = (OPERATOR_USER, STANDBY_USER)) -> str:
    """Log the operator replicas' requests (metadata only), nothing else."""
    listed = ", ".join(f'"{u}"' for u in users)
    return f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  users: [{listed}]
- level: None
"""


def apiserver_args(policy: Path, log: Path) -> list[str]:
    return [
        f"--audit-policy-file={policy}",
        f"--audit-log-path={log}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
    ]


@dataclass(frozen=True)
class Request:
    """One API request the operator made."""

    at: float
    """When the API server received it (epoch seconds)."""
    verb: str
    resource: str
    subresource: str
    name: str
    code: int
    user: str = OPERATOR_USER
    streaming_list: bool = False
    """A watch with ``sendInitialEvents``: a list (every object), whatever its verb says."""

    @property
    def lists(self) -> bool:
        """A list of a whole kind: a LIST (a page of one), or a streaming list."""
        return self.verb == "list" or self.streaming_list

    @property
    def write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def kind(self) -> str:
        sub = f"/{self.subresource}" if self.subresource else ""
        return f"{self.verb} {self.resource}{sub}"

    @property
    def node(self) -> str | None:
        """The fleet node this request is about (by the names sdcguard derives from it)."""
        found = NODE_IN_NAME.search(self.name)
        return found.group(0) if found else None


def _epoch(stamp: str) -> float:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class AuditLog:
    """Reads the audit log as it grows."""

    def __init__(
        self, path: Path, users: frozenset[str] = frozenset({OPERATOR_USER, STANDBY_USER})
    ) -> None:
        self.path = path
        self.users = users
        self.requests: list[Request] = []
        self._seen: set[str] = set()
        self._offset = 0
        self._partial = b""

    def read(self) -> list[Request]:
        """New requests since the last read (also appended to ``requests``)."""
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
            self._offset = fh.tell()
        data = self._partial + data
        lines = data.split(b"\n")
        self._partial = lines.pop()
        new: list[Request] = []
        for line in lines:
            if not line.strip():
                continue
            event = json.loads(line)
            audit_id = event.get("auditID", "")
            user = (event.get("user") or {}).get("username")
            if audit_id in self._seen or user not in self.users:
                continue
            self._seen.add(audit_id)
            ref = event.get("objectRef") or {}
            new.append(
                Request(
                    at=_epoch(event.get("requestReceivedTimestamp") or event["stageTimestamp"]),
                    verb=event.get("verb", ""),
                    resource=ref.get("resource", ""),
                    subresource=ref.get("subresource", ""),
                    name=ref.get("name", ""),
                    code=int((event.get("responseStatus") or {}).get("code", 0)),
                    user=str(user),
                    streaming_list="sendInitialEvents=true" in str(event.get("requestURI", "")),
                )
            )
        self.requests.extend(new)
        return new

    def between(self, start: float, end: float) -> list[Request]:
        self.read()
        return [r for r in self.requests if start <= r.at < end]


def by_kind(requests: list[Request]) -> dict[str, int]:
    return dict(sorted(Counter(r.kind for r in requests).items()))
