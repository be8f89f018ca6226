"""The plugin's API access: kubeconfig resolution, raw JSON reads, and errors a person
can act on instead of stack traces."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from sdcguard.api import GROUP, VERSION

CRDS_MISSING = (
    "sdcguard CRDs are not installed in this cluster; install them with "
    "`helm install sdcguard charts/sdcguard` (or `kubectl apply -f crds/`)"
)
NOT_FOUND_HINTS = {
    "nodes": "list nodes with kubectl get nodes",
    "sdcpolicies": "list policies with kubectl get sdcpolicies",
    "sdctests": "list tests with kubectl get sdctests",
    "repairtickets": "list tickets with kubectl get repairtickets",
    "sdcbaselines": "list baselines with kubectl get sdcbaselines",
    "sdchardwares": "list hardware histories with kubectl sdc hardware",
}
SINGULAR = {
    "nodes": "node",
    "sdcpolicies": "sdcpolicy",
    "sdctests": "sdctest",
    "repairtickets": "repairticket",
    "sdcbaselines": "sdcbaseline",
    "sdchardwares": "sdchardware",
}


class CliError(Exception):
    """A failure explained in one or two sentences, printed without a traceback."""


@dataclass
class Connection:
    """An API client plus what the plugin knows about who is calling."""

    api: client.ApiClient
    server: str
    kubeconfig_user: str | None

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def custom(self) -> client.CustomObjectsApi:
        return client.CustomObjectsApi(self.api)


def connect(kubeconfig: str | None, context: str | None) -> Connection:
    """Connect like kubectl: --kubeconfig, then $KUBECONFIG, then ~/.kube/config, then the
    in-cluster ServiceAccount."""
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    default = Path.home() / ".kube" / "config"
    if path is None and default.is_file():
        path = str(default)
    configuration = client.Configuration()
    user: str | None = None
    if path is not None:
        first = path.split(os.pathsep)[0]
        if kubeconfig and not Path(first).is_file():
            raise CliError(f"kubeconfig {first} does not exist; check --kubeconfig")
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
            contexts, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                config_file=path
            )
        except config.ConfigException as exc:
            raise CliError(f"cannot use kubeconfig {path}: {exc}") from None
        chosen = next((c for c in contexts if c.get("name") == context), active)
        user = (chosen or {}).get("context", {}).get("user")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration
        )
    else:
        raise CliError(
            "no kubeconfig found; pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config"
        )
    configuration.retries = 1
    return Connection(client.ApiClient(configuration), configuration.host, user)


def whoami(conn: Connection) -> str:
    """The caller's user name: as the API server authenticated it (SelfSubjectReview), else the
    kubeconfig user, else $USER."""
    try:
        review = client.AuthenticationV1Api(conn.api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        info = review.status.user_info if review.status else None
        name = info.username if info else None
        if name:
            return str(name)
    except (ApiException, Urllib3Error, AttributeError, ValueError):
        pass
    if conn.kubeconfig_user:
        return conn.kubeconfig_user
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _status_body(exc: ApiException) -> dict[str, Any]:
    try:
        body = json.loads(exc.body or "{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def explain(exc: ApiException, plural: str, name: str | None, server: str) -> CliError:
    """An ApiException as a sentence that says what to do."""
    body = _status_body(exc)
    message = str(body.get("message") or exc.reason or "").strip()
    if exc.status == 404:
        details = body.get("details") or {}
        if plural in NOT_FOUND_HINTS and name and details.get("name") == name:
            return CliError(f"{SINGULAR[plural]} {name} not found; {NOT_FOUND_HINTS[plural]}")
        if plural in SINGULAR and plural != "nodes":
            return CliError(CRDS_MISSING)
        return CliError(f"{SINGULAR.get(plural, plural)} {name or ''} not found: {message}")
    if exc.status == 401:
        return CliError(
            f"the API server at {server} refused your credentials (401); log in again or check "
            "the kubeconfig user"
        )
    if exc.status == 403:
        return CliError(
            f"forbidden: {message}. Ask a cluster admin for the RBAC this needs "
            "(see the sdcguard chart README, 'Who may do what')"
        )
    if exc.status == 422:
        causes = [c.get("message", "") for c in (body.get("details") or {}).get("causes") or []]
        return CliError(f"the API server refused the change: {'; '.join(causes) or message}")
    if exc.status == 409:
        return CliError(f"conflict: {message}; run the command again")
    return CliError(f"API error {exc.status}: {message or exc.reason}")


def call(
    conn: Connection,
    fn: Callable[..., Any],
    *args: Any,
    plural: str,
    name: str | None = None,
    **kwargs: Any,
) -> Any:
    """Run an API method; returns the JSON body as Python objects, raising CliError."""
    try:
        response = fn(*args, _preload_content=False, **kwargs)
    except ApiException as exc:
        raise explain(exc, plural, name, conn.server) from None
    except (Urllib3Error, OSError) as exc:
        raise CliError(
            f"cannot reach the API server at {conn.server} ({type(exc).__name__}); check "
            "--kubeconfig and --context, and that `kubectl cluster-info` works"
        ) from None
    data = response.data
    return json.loads(data) if data else None


def get_custom(conn: Connection, plural: str, name: str) -> dict[str, Any]:
    """One cluster-scoped sdcguard object."""
    obj: dict[str, Any] = call(
        conn,
        conn.custom.get_cluster_custom_object,
        GROUP,
        VERSION,
        plural,
        name,
        plural=plural,
        name=name,
    )
    return obj


def list_custom(conn: Connection, plural: str) -> list[dict[str, Any]]:
    """All objects of one sdcguard resource."""
    body = call(conn, conn.custom.list_cluster_custom_object, GROUP, VERSION, plural, plural=plural)
    items: list[dict[str, Any]] = body.get("items") or []
    return items


def patch_custom(
    conn: Connection, plural: str, name: str, patch: Mapping[str, Any]
) -> dict[str, Any]:
    """Merge-patch a cluster-scoped sdcguard object."""
    obj: dict[str, Any] = call(
        conn,
        conn.custom.patch_cluster_custom_object,
        GROUP,
        VERSION,
        plural,
        name,
        dict(patch),
        plural=plural,
        name=name,
    )
    return obj


def get_node(conn: Connection, name: str) -> dict[str, Any]:
    node: dict[str, Any] = call(conn, conn.core.read_node, name, plural="nodes", name=name)
    return node


def list_nodes(conn: Connection) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = call(conn, conn.core.list_node, plural="nodes").get("items") or []
    return items
