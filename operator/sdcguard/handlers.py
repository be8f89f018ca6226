"""Every Kopf registration of the operator, and nothing else.

Each handler hands what Kopf gives it to the operator's parts (``assembly.py``: the
fleet's copy, the pass scheduler, report admission) and sets Kopf's own settings once
at start-up. Index handlers return ``{}`` (never None) for an object that no longer
belongs in an index: Kopf keeps an object's previous entry when its handler returns
None.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import structlog

from sdcguard.adapters.pass_view import INDEX_NAMES
from sdcguard.api import GROUP, VERSION, SDCBaseline, SDCPolicy
from sdcguard.api.policy import NodeSelector
from sdcguard.assembly import Operator, baseline_entry, policy_entry, policy_spec_entry
from sdcguard.logs import configure_logging
from sdcguard.settings import load_settings

log = structlog.get_logger("sdcguard")


def _op(memo: Any) -> Operator:
    rt: Operator = memo.rt
    return rt


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = load_settings()
    configure_logging(config.log_format, config.log_level)
    rt = memo.rt = Operator.assemble(config, memo)
    rt.start(asyncio.get_running_loop())
    # We post our own Events on transitions; Kopf's per-handler events are noise.
    settings.posting.enabled = False
    settings.posting.level = logging.WARNING
    # One active replica: alone, or the holder of the leader Lease (runtime/terms.py);
    # Kopf's peering is not used.
    settings.peering.standalone = True
    settings.peering.mandatory = False
    # Progress and diff-base bookkeeping only ever lands on our own resources: Nodes,
    # Pods and Jobs are not Kopf's to watch at all (adapters/inventory.py).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.networking.request_timeout = config.api_timeout_seconds * 3
    settings.batching.error_delays = [1, 2, 5, 10, 20]
    # A probe's end should reach its node in tens of milliseconds: do not hold events
    # back for more of the same object (Kopf's default waits 0.1 s).
    settings.batching.batch_window = 0.02
    log.info("operator starting", namespace=config.namespace, dry_run=config.dry_run)


@kopf.on.cleanup()
async def stop_inventory(memo: kopf.Memo, **_: Any) -> None:
    """Kopf stops (``Operator.stop``): a standby-to-be keeps its copy warm."""
    await _op(memo).stop(keep_inventory=bool(memo.get("keep_inventory")))


# Indexes ------------------------------------------------------------------


@kopf.index(GROUP, VERSION, "sdcpolicies")
async def policies_index(
    name: str, spec: kopf.Spec, meta: kopf.Meta, memo: kopf.Memo, **_: Any
) -> dict[str, NodeSelector]:
    """Every policy's selector (a change of it may wake every loop)."""
    _op(memo).policy_seen_as(name, meta)
    return policy_entry(name, spec)


@kopf.index(GROUP, VERSION, "sdcbaselines")
async def baselines_index(
    body: kopf.Body, name: str, memo: kopf.Memo, **_: Any
) -> dict[str, SDCBaseline]:
    """Every readable SDCBaseline (any change wakes every loop)."""
    _op(memo).scheduler.poke()
    return baseline_entry(name, body)


@kopf.index(GROUP, VERSION, "sdcpolicies")
async def policy_specs_index(body: kopf.Body, name: str, **_: Any) -> dict[str, SDCPolicy]:
    """Every readable policy, for the ticket announcer."""
    return policy_spec_entry(name, body)


# The reconcile loop and reports --------------------------------------------


@kopf.daemon(GROUP, VERSION, "sdcpolicies", cancellation_timeout=10)
async def policy_loop(
    name: str, body: kopf.Body, stopped: kopf.DaemonStopped, memo: kopf.Memo, **kwargs: Any
) -> None:
    """Reconcile the policy's nodes as their observations change, urgently when a
    probe ended, and all of them every resync period (``runtime/scheduling.py``)."""
    await _op(memo).run_policy(
        name,
        body,
        {key: kwargs[key] for key in INDEX_NAMES},
        kwargs["policy_specs_index"],
        stopped=lambda: bool(stopped),
    )


@kopf.on.delete(GROUP, VERSION, "sdcpolicies")
async def policy_deleted(name: str, body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    """A deleted policy releases its nodes and ends its tests before its finalizer goes
    (``adapters/policy_release.py``); its loop (a daemon) has stopped already."""
    await _op(memo).release_policy(name, body, kwargs["policies_index"])


@kopf.on.event(GROUP, VERSION, "sdcreports")
async def report_seen(type: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A training job's SDCReport: admitted once (status written), remembered after."""
    if type != "DELETED":
        await _op(memo).report_seen(body)
