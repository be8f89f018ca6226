"""Objects the plugin's cluster tests create on the real API server."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from sdcguard.api import GROUP, VERSION


def create_sdctest(
    custom: client.CustomObjectsApi,
    name: str,
    spec: dict[str, Any],
    status: dict[str, Any] | None = None,
) -> None:
    """An SDCTest as the operator writes one: created, then its status (a subresource,
    so the create alone never sets it) when ``status`` is given."""
    custom.create_cluster_custom_object(
        GROUP,
        VERSION,
        "sdctests",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "SDCTest",
            "metadata": {"name": name},
            "spec": spec,
        },
    )
    if status is not None:
        custom.patch_cluster_custom_object_status(
            GROUP, VERSION, "sdctests", name, {"status": status}
        )
