"""``kubectl sdc migrate-storage``: rewrite every sdcguard object in the stored version.

When a release changes the CRDs' storage version (v1alpha1 to v1beta1), etcd keeps each
object in the version it was last written in until something writes it again; the CRD's
``status.storedVersions`` lists every version that may still be in etcd, and a version
can be removed from the CRDs only once no object is stored in it. This command writes
each object back unchanged (a PUT of the body just read: the API server encodes it in
the storage version), then sets ``storedVersions`` to the storage version alone.

A write that meets a newer object (409) is left alone: whoever changed it in between
wrote it in the storage version already. An object deleted in between (404) needs
nothing. ``storedVersions`` is narrowed only when every object of the kind was written
or found changed, so a failed run can be run again."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcguard.api import GROUP, RESOURCES, VERSION
from sdcguard.api.resources import Resource
from sdcguard.cli.kube import CliError, Connection, call
from sdcguard.cli.output import Result, Table


def _items(conn: Connection, resource: Resource) -> list[dict[str, Any]]:
    """Every object of ``resource``, listed in the operator's (the stored) version."""
    items: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        page = call(
            conn,
            conn.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            resource.plural,
            plural=resource.plural,
            limit=500,
            **({"_continue": token} if token else {}),
        )
        items += page.get("items") or []
        token = (page.get("metadata") or {}).get("continue")
        if not token:
            return items


def _rewrite(conn: Connection, resource: Resource, body: dict[str, Any]) -> str:
    """Write one object back as read: ``rewritten``, ``changed`` (409) or ``gone`` (404)."""
    meta = body.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), meta.get("namespace")
    try:
        if namespace:
            conn.custom.replace_namespaced_custom_object(
                GROUP, VERSION, namespace, resource.plural, name, body
            )
        else:
            conn.custom.replace_cluster_custom_object(GROUP, VERSION, resource.plural, name, body)
    except ApiException as exc:
        if exc.status == 409:
            return "changed"
        if exc.status == 404:
            return "gone"
        where = f"{namespace}/{name}" if namespace else name
        raise CliError(
            f"cannot rewrite {resource.plural} {where} ({exc.status} {exc.reason}); "
            "nothing else of this kind was narrowed: fix that and run migrate-storage again"
        ) from None
    return "rewritten"


def stored_versions(conn: Connection, resource: Resource) -> list[str]:
    """The CRD's ``status.storedVersions``."""
    crd = call(
        conn,
        client.ApiextensionsV1Api(conn.api).read_custom_resource_definition,
        resource.crd_name,
        plural="customresourcedefinitions",
        name=resource.crd_name,
    )
    return list((crd.get("status") or {}).get("storedVersions") or [])


def migrate_storage(conn: Connection) -> Result:
    """Rewrite every object of every sdcguard kind, then narrow ``storedVersions``."""
    rows: list[Sequence[str]] = []
    data: list[dict[str, Any]] = []
    ext = client.ApiextensionsV1Api(conn.api)
    for resource in RESOURCES:
        before = stored_versions(conn, resource)
        counts = {"rewritten": 0, "changed": 0, "gone": 0}
        for body in _items(conn, resource):
            counts[_rewrite(conn, resource, body)] += 1
        after = before
        if before != [VERSION]:
            call(
                conn,
                ext.patch_custom_resource_definition_status,
                resource.crd_name,
                {"status": {"storedVersions": [VERSION]}},
                plural="customresourcedefinitions",
                name=resource.crd_name,
            )
            after = stored_versions(conn, resource)
        rows.append(
            [
                resource.plural,
                str(counts["rewritten"]),
                str(counts["changed"] + counts["gone"]),
                ",".join(before) or "-",
                ",".join(after) or "-",
            ]
        )
        data.append({"resource": resource.plural, **counts, "storedBefore": before,
                     "storedAfter": after})  # fmt: skip
    table = Table(
        ["RESOURCE", "REWRITTEN", "CHANGED-MEANWHILE", "STORED-BEFORE", "STORED-NOW"],
        rows,
        title=f"Every sdcguard object is now stored as {GROUP}/{VERSION}:",
    )
    return Result(data=data, tables=[table])
