"""Megatron-Core's rerun state machine, handed to sdcguard as SDCReports.

Megatron-Core re-runs a step whose loss or gradients look wrong (NaN, spikes) on
the same GPU; it exits with 16 (``EXIT_CODE_RESUME_TO_DISAMBIGUATE``: the result
reproduced, resume elsewhere to decide) or 17
(``EXIT_CODE_FAILED_ON_RESULT_VALIDATION``), and appends a line per event to its
``result_rejected_tracker_filename``::

    ts=... node=HOST device=0 jobID=N/A rank=3 iteration=120 status=first_rerun_reproducible
    result=nan message='loss is NaN'

It tells no scheduler. Run this after the training process in the same Pod::

    python pretrain_gpt.py ...; python -m sdctrain megatron-report --exit-code $? \\
        --tracker /ckpt/rerun-tracker.log

Only lines written on this Pod's host are reported (``node=`` is the Pod's
hostname), so each Pod reports its own GPUs, and only the statuses that accuse
the GPU that ran the step: ``first_rerun_not_reproducible`` (Transient: the same
GPU computed something else the second time) and, when the job exits with 16,
``first_rerun_reproducible`` (Unconfirmed: it needs another GPU, which the
probe's screening provides). A status written after a restart on another GPU
(``second_rerun_*``) is about a host the file does not name, and is skipped.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Mapping

from sdctrain.detection import Detection
from sdctrain.identity import RankInfo
from sdctrain.verdicts import Confirmation, Method

EXIT_RESUME_TO_DISAMBIGUATE = 16
EXIT_FAILED_ON_RESULT_VALIDATION = 17
EXIT_CODES = (EXIT_RESUME_TO_DISAMBIGUATE, EXIT_FAILED_ON_RESULT_VALIDATION)

_LINE = re.compile(
    r"^ts=(?P<ts>.+?) node=(?P<node>\S+) device=(?P<device>\S+) jobID=(?P<job>\S+) "
    r"rank=(?P<rank>\d+) iteration=(?P<iteration>\d+) status=(?P<status>\S+) "
    r"result=(?P<result>.*?) message='(?P<message>.*)'\s*$"
)
_ACCUSING = {
    "first_rerun_not_reproducible": Confirmation.TRANSIENT,
    "first_rerun_reproducible": Confirmation.UNCONFIRMED,
}


def _status(raw: str) -> str:
    # Python 3.12 formats the str-Enum as "RerunValidationStatus.X"; 3.11 as its value.
    return raw.rsplit(".", 1)[-1].lower()


def detections_from_tracker(
    exit_code: int, tracker_text: str, me: RankInfo, hostname: str | None = None
) -> list[Detection]:
    """Detections for this Pod's lines in a Megatron-Core rerun tracker file.

    ``me`` carries the Pod's node, name, namespace and job (from the downward
    API); ``hostname`` is what Megatron wrote as ``node=`` (the Pod's hostname).
    Nothing is reported unless the job exited with 16 or 17.
    """
    if exit_code not in EXIT_CODES:
        return []
    host = hostname or socket.gethostname()
    found: dict[tuple[int, int], Detection] = {}
    for line in tracker_text.splitlines():
        m = _LINE.match(line.strip())
        if m is None or m["node"] != host:
            continue
        status = _status(m["status"])
        confirmation = _ACCUSING.get(status)
        if confirmation is None:
            continue
        if confirmation == Confirmation.UNCONFIRMED and exit_code != EXIT_RESUME_TO_DISAMBIGUATE:
            continue
        rank, iteration = int(m["rank"]), int(m["iteration"])
        detail = (
            f"Megatron-Core rerun state machine at iteration {iteration}: "
            f"{m['message'][:200]!r} on rank {rank} (device {m['device']}); {status}; "
            f"the job exited with {exit_code}"
        )
        found[(rank, iteration)] = Detection(
            method=Method.MEGATRON_RERUN,
            step=iteration,
            rank=rank,
            confirmation=confirmation,
            detail=detail,
            node=me.node,
            pod=me.pod,
            namespace=me.namespace,
            job=me.job,
            gpu_uuid=me.gpu_uuid,
            evidence=(
                ("status", status),
                ("device", m["device"][:32]),
                ("result", m["result"][:128]),
                ("exitCode", str(exit_code)),
            ),
        )
    return list(found.values())


def rank_info_from_env(env: Mapping[str, str]) -> RankInfo:
    """This Pod's identity without touching a device (the job has already exited)."""
    return RankInfo(
        rank=0,
        node=env.get("NODE_NAME") or None,
        pod=env.get("POD_NAME") or env.get("HOSTNAME") or None,
        namespace=env.get("POD_NAMESPACE") or None,
        job=env.get("JOB_NAME") or None,
        gpu_uuid=env.get("SDCGUARD_GPU_UUID") or None,
    )
