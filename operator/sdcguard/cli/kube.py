"""The plugin's API access: kubeconfig resolution, raw JSON reads, and errors a person
can act on instead of stack traces."""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, Field, ValidationError
from urllib3.exceptions import HTTPError as Urllib3Error

from sdcguard.api import GROUP, VERSION, ApiModel, ObjectMeta
from sdcguard.cli.objects import Event, Node
from sdcguard.domain.dra import RESOURCE_SLICES, SliceSnapshot, device_counts

M = TypeVar("M", bound=ApiModel)

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


class _ContextTarget(BaseModel):
    cluster: str | None = None
    user: str | None = None


class _KubeContext(BaseModel):
    """One entry of a kubeconfig's ``contexts`` list."""

    name: str = ""
    context: _ContextTarget = Field(default_factory=_ContextTarget)


def unknown_context(
    context: str, path: str, known: list[_KubeContext], active: Mapping[str, Any] | None
) -> str:
    """Why ``--context`` cannot be used, naming the contexts that can (as kubectl config
    get-contexts would), so the fix is one copy away."""
    current = _KubeContext.model_validate(active).name if active else None
    if not known:
        return (
            f"context {context!r} is not in kubeconfig {path}: it has no contexts; "
            "add one with kubectl config set-context"
        )
    names = ", ".join(
        f"{c.name} (current)" if c.name == current else c.name
        for c in sorted(known, key=lambda c: c.name)
    )
    return (
        f"context {context!r} is not in kubeconfig {path}; its contexts: {names}. "
        "Pick one with --context (kubectl config get-contexts lists them)"
    )


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
            contexts, active = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
                config_file=path
            )
        except config.ConfigException as exc:
            raise CliError(f"cannot use kubeconfig {path}: {exc}") from None
        known = [_KubeContext.model_validate(c) for c in contexts or []]
        if context is not None and context not in {c.name for c in known}:
            raise CliError(unknown_context(context, path, known, active))
        try:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, context=context, client_configuration=configuration
            )
        except config.ConfigException as exc:
            raise CliError(f"cannot use kubeconfig {path}: {exc}") from None
        current = _KubeContext.model_validate(active).name if active else None
        wanted = context if context is not None else current
        user = next((c.context.user for c in known if c.name == wanted), None)
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


class _Cause(BaseModel):
    message: str = ""


class _Details(BaseModel):
    name: str | None = None
    causes: list[_Cause] | None = None


class _Status(BaseModel):
    """The metav1.Status body of a refused request, as far as the messages use it."""

    message: str | None = None
    details: _Details | None = None


def _status_body(exc: ApiException) -> _Status:
    try:
        return _Status.model_validate_json(exc.body or "{}")
    except ValidationError:
        return _Status()


def explain(exc: ApiException, plural: str, name: str | None, server: str) -> CliError:
    """An ApiException as a sentence that says what to do."""
    body = _status_body(exc)
    details = body.details or _Details()
    message = str(body.message or exc.reason or "").strip()
    if exc.status == 404:
        if plural in NOT_FOUND_HINTS and name and details.name == name:
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
        causes = [c.message for c in details.causes or []]
        return CliError(f"the API server refused the change: {'; '.join(causes) or message}")
    if exc.status == 409:
        return CliError(f"conflict: {message}; run the command again")
    return CliError(f"API error {exc.status}: {message or exc.reason}")


def unreachable(conn: Connection, exc: Exception) -> CliError:
    return CliError(
        f"cannot reach the API server at {conn.server} ({type(exc).__name__}); check "
        "--kubeconfig and --context, and that `kubectl cluster-info` works"
    )


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
        raise unreachable(conn, exc) from None
    data = response.data
    return json.loads(data) if data else None


class _Named(ApiModel):
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)


class _ItemList(BaseModel):
    items: list[dict[str, Any]] | None = None


class _Continue(BaseModel):
    continue_: str | None = Field(default=None, alias="continue")


class _ListMeta(BaseModel):
    metadata: _Continue = Field(default_factory=_Continue)


def _items(body: Any) -> list[dict[str, Any]]:
    """The ``items`` of a list response."""
    return _ItemList.model_validate(body).items or []


def item_names(body: Any) -> list[str]:
    """The names of the items of a list response (full objects or metadata only)."""
    return [_Named.model_validate(item).metadata.name for item in _items(body)]


def _name_of(body: Mapping[str, Any]) -> str:
    try:
        return _Named.model_validate(body).metadata.name
    except ValidationError:
        return "(unnamed)"


def undecodable(plural: str, body: Mapping[str, Any], exc: ValidationError) -> str:
    """Why an object does not fit the plugin's API models, naming the first bad field."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "the object"
    return (
        f"{SINGULAR.get(plural, plural)} {_name_of(body)} does not match this plugin's "
        f"{VERSION} API ({where}: {first['msg']}); use a plugin of the operator's version"
    )


def decode(model: type[M], body: Mapping[str, Any], plural: str) -> M:
    """``body`` as ``model``; a body that does not fit is a CliError that names the field."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise CliError(undecodable(plural, body, exc)) from None


@dataclass
class Listing(Generic[M]):
    """The objects of one resource that decoded, and a warning for each one that did not
    (shown on stderr; the command goes on with the rest)."""

    items: list[M]
    warnings: list[str] = field(default_factory=list)


def get_typed(conn: Connection, model: type[M], plural: str, name: str) -> M:
    """One cluster-scoped sdcguard object, decoded into its API model."""
    body = call(
        conn,
        conn.custom.get_cluster_custom_object,
        GROUP,
        VERSION,
        plural,
        name,
        plural=plural,
        name=name,
    )
    return decode(model, body, plural)


LIST_PAGE = 500
"""Objects per list request: a fleet's history can be hundreds of thousands of SDCTests,
and one unpaged answer would hold them all at once, on the API server and here."""


@dataclass(frozen=True)
class Where(Generic[M]):
    """The objects a list wants: a field selector over the CRD's ``selectableFields``,
    which the API server answers, and the same question asked of each decoded object,
    for a server that cannot: CRDs applied by an older chart, or a cluster where the
    selectable fields are off (Kubernetes 1.30 without its feature gate) answer 400,
    and the list is then made whole and filtered here."""

    field_selector: str
    keep: Callable[[M], bool]


def list_typed(
    conn: Connection, model: type[M], plural: str, where: Where[M] | None = None
) -> Listing[M]:
    """The objects of one sdcguard resource (every namespace for a namespaced one) that
    ``where`` keeps (None: all), decoded into its API model, listed in pages."""
    if where is not None:
        try:
            return _list_pages(conn, model, plural, where.field_selector)
        except ApiException as exc:
            if exc.status != 400:
                raise explain(exc, plural, None, conn.server) from None
        listing = _list_pages(conn, model, plural, None)
        listing.items = [item for item in listing.items if where.keep(item)]
        return listing
    try:
        return _list_pages(conn, model, plural, None)
    except ApiException as exc:
        raise explain(exc, plural, None, conn.server) from None


def _list_pages(
    conn: Connection, model: type[M], plural: str, field_selector: str | None
) -> Listing[M]:
    """Every page of one list; raises the ApiException of a refused request."""
    listing: Listing[M] = Listing([])
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"limit": LIST_PAGE}
        if token:
            kwargs["_continue"] = token
        if field_selector:
            kwargs["field_selector"] = field_selector
        try:
            response: Any = conn.custom.list_cluster_custom_object(
                GROUP, VERSION, plural, _preload_content=False, **kwargs
            )
        except (Urllib3Error, OSError) as exc:
            raise unreachable(conn, exc) from None
        body = json.loads(response.data) if response.data else None
        for item in _items(body):
            try:
                listing.items.append(model.model_validate(item))
            except ValidationError as exc:
                listing.warnings.append(f"warning: left out: {undecodable(plural, item, exc)}")
        token = _ListMeta.model_validate(body or {}).metadata.continue_ or None
        if not token:
            return listing


def patch_custom(
    conn: Connection, plural: str, name: str, patch: Mapping[str, Any]
) -> dict[str, Any]:
    """Merge-patch a cluster-scoped sdcguard object; returns the server's copy."""
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


def dra_devices(
    conn: Connection, node: str | None = None
) -> dict[str, tuple[tuple[str, int], ...]]:
    """(driver, devices) the ResourceSlices publish per node (``node``: that one's
    only), as the operator counts them; empty where the cluster serves no DRA or the
    user may not list slices (the operator's own copy still has them)."""
    kwargs: dict[str, Any] = {"field_selector": f"spec.nodeName={node}"} if node else {}
    try:
        response: Any = conn.custom.list_cluster_custom_object(
            *RESOURCE_SLICES, _preload_content=False, **kwargs
        )
        body = json.loads(response.data or b"{}")
    except (ApiException, Urllib3Error, OSError, ValueError):
        return {}
    by_node: dict[str, list[SliceSnapshot]] = {}
    for item in _items(body):
        snapshot = SliceSnapshot.from_body(item)
        if snapshot is not None:
            by_node.setdefault(snapshot.node, []).append(snapshot)
    return {name: device_counts(slices) for name, slices in by_node.items()}


def get_node(conn: Connection, name: str) -> Node:
    body = call(conn, conn.core.read_node, name, plural="nodes", name=name)
    return Node.from_body(body, dra_devices(conn, name).get(name, ()))


def list_nodes(conn: Connection) -> list[Node]:
    published = dra_devices(conn)
    return [
        Node.from_body(item, published.get(str((item.get("metadata") or {}).get("name")), ()))
        for item in _items(call(conn, conn.core.list_node, plural="nodes"))
    ]


def list_events(conn: Connection, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Event]:
    """Events from ``fn`` (a core list call), decoded."""
    return [
        Event.model_validate(item)
        for item in _items(call(conn, fn, *args, plural="events", **kwargs))
    ]
