"""Judging: from a probe Pod's end to a test verdict, and from verdicts to confirmation.

Verdicts (one per test):

- **SDC**: some check computed a wrong answer: the probe found devices disagreeing, a
  replay differing, or an exact collective sum off (check verdict "fail"), or the
  check's digest differs from a *trusted* baseline for the *same* fingerprint.
- **Crash** (the Pod failed: signal, OOM, exit status other than 0/1/2) and **Timeout**
  (the Job's deadline passed) are faults of another kind; they never quarantine.
- **Inconclusive**: anything that is not evidence either way: a probe container the
  kubelet could not start (reason: the kubelet's own, e.g. ErrImageNeverPull), no
  result, a result cut short or of an unknown schema version, a "pass" without digests,
  a fingerprint other than the baseline's, no trusted baseline yet, an expected check
  missing, a result that contradicts the exit status, a probe that stopped with its
  own error (ProbeError: its result's reason, or the error line of the log tail the
  kubelet kept), a catch target the policy refuses to run short of (CatchShortfall).
- **Pass**: every expected check ran and matched its trusted baseline.

A catch target missed under onShortfall Flag does not change the verdict: it is added
to the message and recorded beside it (:func:`record_catch`: status.catchTargetMet,
status.catchShortfall, the condition CatchTargetMet).

Precedence: SDC evidence from any check wins over everything (a Pod that computed
wrong answers and then crashed still computed wrong answers); then Timeout, Crash,
Inconclusive; Pass only when nothing else applies. Garbage never passes and never
raises.

Check depth, lightest first: compute < collective < memory < golden. Depth measures
how much of the path a training job takes the check exercises; golden (a small
training run compared with golden values) is deepest, as in the study it is the
check that exposed every SDC node. A verdict's headline is its deepest failing (or
inconclusive) check. A failed check is cleared only by a later pass *of that same
check*: a passing check of another kind exercises other hardware paths, so in
particular a lighter passing check never clears a failed deeper one.

Confirmation (:func:`assess`): a first SDC verdict makes the node Suspect and runs the
same suite again, up to ``confirmation.reruns`` times; one re-run that fails again
(on the same check, when ``requireSameCheck``) confirms and quarantines. If every
re-run passes, the node is *Flaky*: it stays Suspect and held (intermittent SDC is
common, so one clean run does not acquit it) and is screened again after the
inconclusive back-off; a pass then clears it, another failure confirms.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from sdcguard.api import (
    CheckStatus,
    CheckVerdict,
    Confirmation,
    ScreeningReason,
    SDCBaselineSpec,
    SDCTestPhase,
    SDCTestStatus,
    Verdict,
    set_condition,
)
from sdcguard.domain.attestation import Attestation
from sdcguard.domain.echo import bounded
from sdcguard.domain.observed import TestFacts
from sdcprobe.result import CheckResult, Fingerprint, ProbeResult, RunPlan, parse_result

CHECK_DEPTH: Mapping[str, int] = {"compute": 1, "collective": 2, "memory": 3, "golden": 4}
"""Depth of each check (see module docstring); unknown checks are lightest."""
VALID_EXIT_CODES = (0, 1, 2)
TERMINATION_LIMIT = 4096
"""Bytes the kubelet keeps of a termination message."""
MAX_REASON = 1024
PROBE_ERROR_LIMIT = 300
"""Characters kept of the probe's own error line in a test's message."""
SELF_JUDGED = "Match: equals the probe's baseline"
"""A check's reason when it passed only against the probe's own baseline."""
CATCH_CONDITION = "CatchTargetMet"
"""The SDCTest condition that says whether the screening reached its catch target."""


@dataclass(frozen=True)
class NodeExpectation:
    """What the operator knows of the node a result is about, to check the fingerprint
    the result declares (the probe computes it on the node, so it is the node's word)."""

    product: str | None = None
    """The accelerator product the node's labels name (``nvidia.com/gpu.product``)."""
    count: int | None = None
    """Its accelerators per its labels (``nvidia.com/gpu.count``; None on MIG nodes)."""
    fingerprints: frozenset[str] = frozenset()
    """Fingerprint hashes the node's earlier screenings ran under."""

    @classmethod
    def of(cls, labels: Mapping[str, str], fingerprints: Collection[str]) -> NodeExpectation:
        count = labels.get("nvidia.com/gpu.count", "")
        mig = any(key.startswith("nvidia.com/mig") for key in labels)
        return cls(
            product=labels.get("nvidia.com/gpu.product") or None,
            count=int(count) if count.isdigit() and not mig else None,
            fingerprints=frozenset(f for f in fingerprints if f),
        )


def _same_product(label: str, model: str) -> bool:
    """GPU feature discovery writes ``NVIDIA-H100-80GB-HBM3`` where the runtime says
    ``NVIDIA H100 80GB HBM3``: compared on letters and digits, without case."""

    def norm(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    return norm(label) == norm(model)


def _unexpected(fingerprint: Fingerprint, node: NodeExpectation) -> str | None:
    """Why the declared fingerprint is not this node's (None: nothing contradicts it).
    Only CUDA results are compared with NVIDIA's labels."""
    if fingerprint.backend != "cuda":
        return None
    if node.product and not _same_product(node.product, fingerprint.device_model):
        return (
            f"the result declares {fingerprint.device_model!r} but the node's label says "
            f"{node.product!r}"
        )
    if node.count is not None and fingerprint.device_count != node.count:
        return (
            f"the result declares {fingerprint.device_count} devices but the node's label "
            f"says {node.count}"
        )
    return None


def _hardware_has_trusted_baseline(
    fingerprint: Fingerprint,
    node: NodeExpectation | None,
    baselines: Mapping[str, SDCBaselineSpec],
) -> str | None:
    """The trusted baseline a self-judged pass would sidestep: one for a fingerprint the
    node's earlier screenings ran under, or for the same device model and count."""
    for spec in baselines.values():
        if not spec.trusted or spec.fingerprint.hash == fingerprint.hash:
            continue
        if node is not None and spec.fingerprint.hash in node.fingerprints:
            return spec.fingerprint.hash
        if (
            spec.fingerprint.device_model == fingerprint.device_model
            and spec.fingerprint.device_count == fingerprint.device_count
        ):
            return spec.fingerprint.hash
    return None


def depth(check: str) -> int:
    """The depth of ``check`` (0 for checks this operator does not know)."""
    return CHECK_DEPTH.get(check, 0)


def clears(failed: Collection[str], passed: Collection[str]) -> bool:
    """Whether passing ``passed`` clears the earlier failure of every check in ``failed``."""
    return set(failed) <= set(passed)


@dataclass(frozen=True)
class PodEnd:
    """How the probe Pod ended, as the adapter read it from the Pod status."""

    message: str | None
    """The container's termination message: the probe's result document, or, when the
    probe died before writing one, the tail of its log (the Job's container uses
    terminationMessagePolicy FallbackToLogsOnError)."""
    exit_code: int | None
    timed_out: bool = False
    """The Job's activeDeadlineSeconds passed."""
    crashed: bool = False
    """Killed (OOM, eviction, signal) or failed to start."""
    detail: str = ""
    """The kubelet's reason, e.g. OOMKilled or DeadlineExceeded."""
    never_started: bool = False
    """The kubelet could not start the container (``detail``: its waiting reason and
    message, e.g. ErrImageNeverPull naming the image)."""
    deleted: bool = False
    """The Pod was deleted before it ended (a drain or an eviction: an autoscaler
    removing the node, or a person), so the kubelet killed the probe."""


NEVER_STARTED_REASONS = frozenset(
    {
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Waiting reasons of a probe container the kubelet cannot start: an image that is absent
(pull policy Never), cannot be pulled, or is misnamed, or a container that cannot be
created. A pull that fails once is retried by the kubelet with a back-off; the screening
is not kept waiting behind it (it ends Inconclusive and is retried after the policy's
inconclusive back-off)."""


def _kubelet_reason(detail: str, default: str) -> str:
    """The kubelet's reason word at the start of ``detail`` (``Reason: message``), if it is
    one CamelCase word, else ``default``."""
    word = detail.split(":", 1)[0].strip()
    return word if word.isascii() and word.isalpha() and 0 < len(word) <= 64 else default


@dataclass(frozen=True)
class CheckJudgement:
    """One check, judged."""

    name: str
    verdict: CheckVerdict
    reason: str
    digest: str | None = None
    metrics: Mapping[str, str] = field(default_factory=dict)
    odd_device: int | None = None
    first_divergent_step: int | None = None
    first_divergent_submodule: str | None = None
    baseline: str = "absent"
    catch_chance: float | None = None
    """The chance this check's rounds had of catching the target's fault (None: the
    probe did not say)."""

    def to_status(self) -> CheckStatus:
        """The SDCTest status entry."""
        return CheckStatus.model_validate(
            {
                "name": self.name[:64],
                "verdict": self.verdict,
                "reason": self.reason[:MAX_REASON],
                "digest": self.digest,
                "metrics": {k[:64]: v[:256] for k, v in list(self.metrics.items())[:64]},
                "odd_device": self.odd_device,
                "first_divergent_step": self.first_divergent_step,
                "first_divergent_submodule": (self.first_divergent_submodule or None)
                and self.first_divergent_submodule[:256],
                "baseline": self.baseline,
                "catch_chance": self.catch_chance,
            }
        )


@dataclass(frozen=True)
class CatchOutcome:
    """What the screening aimed for and reached, as the probe's plan reported it; every
    field None for a probe that says nothing about a catch target (an older one)."""

    target: float | None = None
    fraction: float | None = None
    met: bool | None = None
    """Every check reached the target (False if the probe or the chances say not)."""
    shortfall: str = ""
    """Which checks fell short and the budget that would reach it."""

    def note(self) -> str:
        """A clause for the test's message when the target was missed, else ""."""
        return f"; catch target missed: {self.shortfall}" if self.met is False else ""


@dataclass(frozen=True)
class Judgement:
    """The verdict of one test, with what supports it."""

    verdict: Verdict
    reason: str
    """One CamelCase word (SDCDetected, DigestMismatch, ResultTruncated, ...)."""
    message: str
    checks: tuple[CheckJudgement, ...] = ()
    fingerprint: Fingerprint | None = None
    injected: bool = False
    """The probe ran with fault injection (a test or benchmark, not a real screening)."""
    devices: tuple[str, ...] = ()
    """Each device's UUID or serial by index, as the probe named them ("" unknown)."""
    catch: CatchOutcome = CatchOutcome()
    """The catch target and whether the screening reached it."""

    @property
    def phase(self) -> SDCTestPhase:
        """The SDCTest phase for this verdict."""
        if self.verdict == Verdict.PASS:
            return SDCTestPhase.PASSED
        if self.verdict == Verdict.SDC:
            return SDCTestPhase.FAILED
        return SDCTestPhase.INCONCLUSIVE  # Crash and Timeout are no evidence either way

    @property
    def failed_checks(self) -> frozenset[str]:
        return frozenset(c.name for c in self.checks if c.verdict == CheckVerdict.SDC)

    @property
    def passed_checks(self) -> frozenset[str]:
        return frozenset(c.name for c in self.checks if c.verdict == CheckVerdict.PASS)

    @property
    def digests(self) -> dict[str, str]:
        """Digests of the checks that found no SDC: what a baseline candidate records."""
        return {
            c.name: c.digest
            for c in self.checks
            if c.digest is not None and c.verdict != CheckVerdict.SDC
        }

    def check_statuses(self) -> list[CheckStatus]:
        """The per-check entries of the SDCTest status."""
        return [c.to_status() for c in self.checks]


def _metric(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def clean_text(text: str, limit: int = PROBE_ERROR_LIMIT) -> str:
    """``text`` on one line for a status message: control characters (terminal escapes
    included) become spaces, runs of spaces one, and at most ``limit`` characters."""
    printable = "".join(" " if (ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0) else ch for ch in text)
    return bounded(" ".join(printable.split()), limit)


def probe_error_line(log_tail: str) -> str:
    """The line of a probe log's tail that says why it stopped: the last one naming an
    error (argparse's "... error: unrecognized arguments: --sizee 5", a Python
    exception), else the last non-empty line; cleaned and bounded."""
    lines = [line.strip() for line in log_tail.splitlines() if line.strip()]
    if not lines:
        return ""
    marked = [line for line in lines if "error" in line.lower() or "exception" in line.lower()]
    return clean_text((marked or lines)[-1])


def _probability(value: object, *, open_top: bool = False) -> float | None:
    """``value`` if it is a finite number in [0, 1] (or (0, 1) with ``open_top``), else
    None: a malformed figure is no figure."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        return None
    if open_top and not 0.0 < number < 1.0:
        return None
    return number


def _catch_chances(plan: RunPlan | None) -> dict[str, float]:
    if plan is None:
        return {}
    # Empty in results of probes older than the catch target (the field's default).
    chances: Mapping[str, object] = plan.catch_chance
    return {
        str(name): chance
        for name, value in chances.items()
        if (chance := _probability(value)) is not None
    }


def _catch_outcome(plan: RunPlan | None, checks: Collection[CheckJudgement]) -> CatchOutcome:
    """The catch target the plan reports and whether every judged check reached it.
    The probe's own ``target_met`` is trusted only to say no: the chances it lists
    must also reach the target, and a check without one did not."""
    if plan is None:
        return CatchOutcome()
    target = _probability(plan.catch_target, open_top=True)
    fraction = _probability(plan.catch_fraction)
    if target is None:
        return CatchOutcome(fraction=fraction)
    short = [c for c in checks if c.catch_chance is None or c.catch_chance < target]
    met = bool(checks) and not short and plan.target_met is not False
    text = plan.shortfall
    shortfall = clean_text(text, MAX_REASON) if text and not met else ""
    if not met and not shortfall:
        where = "; ".join(
            f"{c.name} {'no figure' if c.catch_chance is None else f'{c.catch_chance:.3f}'}"
            for c in short
        )
        shortfall = f"catch target {target:g} not reached" + (f" by {where}" if where else "")
    return CatchOutcome(target, fraction, met, shortfall)


def _classify(reason: str) -> str:
    text = reason.lower()
    if "empty termination message" in text:
        return "ResultMissing"
    if "truncated" in text:
        return "ResultTruncated"
    if "schema_version" in text:
        return "UnknownSchema"
    return "InvalidResult"


def _read(message: str | None) -> tuple[ProbeResult | None, str, str]:
    """The parsed result, or None with (reason, message) saying why not."""
    if message is None or not message.strip():
        return None, "ResultMissing", "the probe wrote no result (termination message empty)"
    size = len(message.encode("utf-8", errors="replace"))
    if size > TERMINATION_LIMIT:
        # The probe squeezes its result to the limit and the kubelet cuts at it: a longer
        # message did not come from the probe through a kubelet.
        return (
            None,
            "ResultOversized",
            f"termination message of {size} bytes exceeds the {TERMINATION_LIMIT}-byte limit",
        )
    try:
        return parse_result(message), "", ""
    except Exception as exc:  # any malformed text is "no result", never a crash
        reason = getattr(exc, "reason", None) or f"{type(exc).__name__}: {exc}"
        return None, _classify(str(reason)), f"unusable probe result: {reason}"[:MAX_REASON]


def _judge_check(
    name: str,
    check: CheckResult,
    fingerprint: Fingerprint | None,
    baseline: SDCBaselineSpec | None,
    catch_chance: float | None = None,
) -> CheckJudgement:
    base = CheckJudgement(
        name,
        CheckVerdict.INCONCLUSIVE,
        "",
        digest=check.digest,
        metrics={k: _metric(v) for k, v in check.metrics.items() if v is not None},
        odd_device=check.odd_device,
        first_divergent_step=check.first_divergent_step,
        first_divergent_submodule=check.first_divergent_submodule,
        baseline=check.baseline,
        catch_chance=catch_chance,
    )

    def judged(
        verdict: CheckVerdict, reason: str, compared: str = check.baseline
    ) -> CheckJudgement:
        return replace(base, verdict=verdict, reason=reason, baseline=compared)

    said = f": {check.reason}" if check.reason else ""
    if check.baseline == "fingerprint-mismatch":
        # Digests from other hardware or software say nothing about this node.
        return judged(
            CheckVerdict.INCONCLUSIVE,
            f"FingerprintMismatch: the probe's baseline is for other hardware or software{said}",
        )
    if check.verdict == "fail":
        where = f" on device {check.odd_device}" if check.odd_device is not None else ""
        step = check.first_divergent_step
        since = f" from step {step}" if step is not None else ""
        return judged(CheckVerdict.SDC, f"SDCDetected: wrong results{where}{since}{said}")
    if check.digest is None:
        what = "passed without a digest" if check.verdict == "pass" else "was inconclusive"
        return judged(CheckVerdict.INCONCLUSIVE, f"NoDigest: the check {what}{said}")
    golden = (
        baseline.digests.get(name)
        if baseline is not None
        and baseline.trusted
        and fingerprint is not None
        and baseline.fingerprint.hash == fingerprint.hash
        else None
    )
    if golden is not None:
        # The operator's trusted baseline is authoritative: a digest covers everything
        # the check computed, so equal means right and different means wrong.
        if golden == check.digest:
            return judged(CheckVerdict.PASS, "Match: equals the trusted baseline", "match")
        return judged(
            CheckVerdict.SDC,
            f"DigestMismatch: differs from the trusted baseline {golden[:12]}",
            "mismatch",
        )
    if check.verdict == "pass" and check.baseline == "match":
        return judged(CheckVerdict.PASS, SELF_JUDGED)
    if check.verdict == "pass" or check.baseline == "absent":
        return judged(
            CheckVerdict.INCONCLUSIVE,
            "BaselineAbsent: no trusted baseline for this fingerprint yet",
            "absent",
        )
    return judged(CheckVerdict.INCONCLUSIVE, f"ProbeInconclusive{said}")


def _headline(checks: list[CheckJudgement]) -> CheckJudgement:
    return max(checks, key=lambda c: (depth(c.name), c.name))


def judge_result(
    end: PodEnd,
    expected_checks: Collection[str],
    baselines: Mapping[str, SDCBaselineSpec] | None = None,
    node: NodeExpectation | None = None,
    attestation: Attestation | None = None,
) -> Judgement:
    """Judge how a probe Pod ended (see the module docstring for the rules).

    ``expected_checks`` are the checks of the test's suite; ``baselines`` maps
    fingerprint hashes to SDCBaseline specs (only a trusted one for the result's
    own fingerprint is used); ``node`` what the operator knows of the node, to check
    the fingerprint the result declares; ``attestation`` the nonce and key the result
    must be sealed with (None: results are not sealed). Never raises for any input text.
    """
    if attestation is not None and end.message and end.message.lstrip().startswith("{"):
        # A result document must be sealed for this screening (a log tail the kubelet
        # kept of a probe that died is not a result and is judged below as such).
        document, why = attestation.open(end.message)
        if document is None:
            return Judgement(
                Verdict.INCONCLUSIVE,
                "Unattested",
                f"the probe result is not this screening's: {why}; never a pass",
            )
        end = replace(end, message=document)
    result, problem, problem_message = _read(end.message)
    if (
        problem == "InvalidResult"
        and end.message
        and end.exit_code not in (None, 0)
        and not end.message.lstrip().startswith(("{", "["))
    ):
        # Not a result at all, from a probe that exited with an error: the kubelet kept
        # its log's tail (FallbackToLogsOnError). Its own error line says why it stopped.
        line = probe_error_line(end.message)
        if line:
            problem, problem_message = "ProbeError", f"the probe stopped with an error: {line}"
    fingerprint = result.fingerprint if result else None
    baseline = (baselines or {}).get(fingerprint.hash) if fingerprint else None
    chances = _catch_chances(result.plan if result else None)
    checks = (
        [
            _judge_check(n, c, fingerprint, baseline, chances.get(n))
            for n, c in sorted(result.checks.items())
        ]
        if result
        else []
    )
    catch = _catch_outcome(result.plan if result else None, checks)
    injected = bool(result and result.injection.enabled)
    note = (
        f" (fault injection on: {result.injection.count} corruptions)"
        if result and injected
        else ""
    )

    def judged(verdict: Verdict, reason: str, message: str) -> Judgement:
        told = catch.note() if reason != "CatchShortfall" else ""
        return Judgement(
            verdict,
            reason,
            bounded(message + note + told, MAX_REASON),
            tuple(checks),
            fingerprint,
            injected,
            tuple(result.devices) if result else (),
            catch,
        )

    sdc = [c for c in checks if c.verdict == CheckVerdict.SDC]
    if sdc:
        head = _headline(sdc)
        names = ", ".join(c.name for c in sorted(sdc, key=lambda c: -depth(c.name)))
        reason = (
            "DigestMismatch"
            if all(c.baseline == "mismatch" and c.reason.startswith("Digest") for c in sdc)
            else "SDCDetected"
        )
        ended = ""
        if end.timed_out or end.crashed:
            ended = f" (then the Pod {'timed out' if end.timed_out else 'crashed'})"
        return judged(Verdict.SDC, reason, f"SDC in {names}: {head.name}: {head.reason}{ended}")
    if end.never_started:
        return judged(
            Verdict.INCONCLUSIVE,
            _kubelet_reason(end.detail, "NotStarted"),
            f"the kubelet could not start the probe container: {end.detail or 'no reason'}",
        )
    if end.timed_out:
        return judged(
            Verdict.TIMEOUT, "TimedOut", f"the probe Job ran past its deadline {end.detail}".strip()
        )
    killed = end.crashed or (end.exit_code is not None and end.exit_code not in VALID_EXIT_CODES)
    if end.deleted and (killed or result is None):
        # Not the probe's fault, nor the hardware's: the Pod was taken away mid-run.
        return judged(
            Verdict.INCONCLUSIVE,
            "ProbePodDeleted",
            "the probe Pod was deleted before the probe finished (a drain or eviction: an "
            "autoscaler removing the node, or a person); "
            f"{problem_message or 'no SDC evidence'}",
        )
    if killed:
        what = end.detail or f"exit status {end.exit_code}"
        return judged(
            Verdict.CRASH,
            "Crashed",
            f"the probe crashed ({what}); {problem_message or 'no SDC evidence'}",
        )
    if result is None:
        return judged(Verdict.INCONCLUSIVE, problem, problem_message)
    if end.exit_code is not None and end.exit_code != result.exit_code():
        return judged(
            Verdict.INCONCLUSIVE,
            "Inconsistent",
            f"exit status {end.exit_code} contradicts the result's verdict {result.verdict!r}",
        )
    inconclusive = [c for c in checks if c.verdict == CheckVerdict.INCONCLUSIVE]
    plan_error = result.plan.error if result.plan is not None else None
    if plan_error and len(inconclusive) == len(checks):
        # The probe refused to run: its budget did not fit the smallest plan at the
        # round costs it measured (a loaded or slow node, or a budget set too low), or
        # could not reach the catch target and the policy says Refuse.
        # Each check then says only "no result"; the plan says why.
        refused = plan_error.startswith("refused:") and catch.target is not None
        return judged(
            Verdict.INCONCLUSIVE,
            "CatchShortfall" if refused else "NoPlan",
            f"the probe ran no check: {clean_text(plan_error, MAX_REASON)}",
        )
    if inconclusive:
        head = _headline(inconclusive)
        code = head.reason.split(":", 1)[0]
        return judged(Verdict.INCONCLUSIVE, code, f"{head.name}: {head.reason}")
    if result.verdict == "fail":
        return judged(
            Verdict.INCONCLUSIVE, "Inconsistent", "the probe reported 'fail' but no check failed"
        )
    if not checks and result.reason:
        # The probe stopped before any check and said why (bad arguments, a signal).
        return judged(
            Verdict.INCONCLUSIVE,
            "ProbeError",
            f"the probe ran no check: {clean_text(result.reason)}",
        )
    missing = sorted(set(expected_checks) - {c.name for c in checks})
    if missing:
        cut = " (the result was truncated)" if result.truncated else ""
        return judged(
            Verdict.INCONCLUSIVE, "CheckMissing", f"no result for {', '.join(missing)}{cut}"
        )
    if not checks:
        said = f": {result.reason}" if result.reason else ""
        return judged(Verdict.INCONCLUSIVE, "ProbeInconclusive", f"no check ran{said}")
    unexpected = _unexpected(fingerprint, node) if fingerprint and node else None
    if unexpected:
        return judged(
            Verdict.INCONCLUSIVE,
            "FingerprintUnexpected",
            f"the result's fingerprint is not this node's: {unexpected}; not a pass",
        )
    self_judged = [c for c in checks if c.reason.startswith(SELF_JUDGED)]
    shadowed = (
        _hardware_has_trusted_baseline(fingerprint, node, baselines or {})
        if self_judged and fingerprint
        else None
    )
    if shadowed:
        # The fingerprint is the probe's own word: a changed field (and a recomputed
        # hash) must not turn "no trusted baseline" into the probe judging itself.
        return judged(
            Verdict.INCONCLUSIVE,
            "SelfJudged",
            f"{', '.join(c.name for c in self_judged)} passed only against the probe's "
            f"own baseline under fingerprint {fingerprint.hash[:12] if fingerprint else ''}"
            f", while this hardware has the trusted baseline {shadowed[:12]}: not a pass",
        )
    # Every check matched a trusted baseline: a top-level "inconclusive" from a probe
    # that had no baseline to compare with does not take that away.
    names = ", ".join(c.name for c in checks)
    return judged(Verdict.PASS, "Passed", f"{names} matched their baseline")


def record_catch(status: SDCTestStatus, judgement: Judgement, now: dt.datetime) -> SDCTestStatus:
    """``status`` with the screening's catch target and outcome, and the condition
    CatchTargetMet (True, or False with reason CatchShortfall and what fell short) when
    the probe reported a target. A probe that reported none leaves the fields null and
    no condition, so a shortfall is never hidden and never invented."""
    catch = judgement.catch
    status = status.model_copy(
        update={
            "catch_target": catch.target,
            "catch_fraction": catch.fraction,
            "catch_target_met": catch.met,
            "catch_shortfall": bounded(catch.shortfall),
        }
    )
    if catch.met is None:
        return status
    if catch.met:
        met = f"every check reached {catch.target:g}"
        if catch.fraction is not None:
            met += f" for a fault in {100 * catch.fraction:g}% of rounds"
        conditions = set_condition(
            status.conditions, CATCH_CONDITION, "True", "CatchTargetMet", met, now
        )
    else:
        conditions = set_condition(
            status.conditions,
            CATCH_CONDITION,
            "False",
            "CatchShortfall",
            bounded(catch.shortfall),
            now,
        )
    return status.model_copy(update={"conditions": conditions})


class Outcome(StrEnum):
    """What a finished test means for a node, given its suspicion."""

    CLEARED = "Cleared"
    CONFIRMED = "Confirmed"
    NEEDS_RERUN = "NeedsRerun"
    FLAKY = "Flaky"
    INCONCLUSIVE = "Inconclusive"


@dataclass(frozen=True)
class Assessment:
    """The outcome, the suspicion that remains, and a sentence for Events."""

    outcome: Outcome
    suspect_checks: frozenset[str]
    message: str


def assess(
    test: TestFacts, suspect_checks: frozenset[str], confirmation: Confirmation
) -> Assessment:
    """Apply the confirmation policy to a finished test (see the module docstring).

    ``suspect_checks``: checks that failed earlier and are not yet cleared (empty when
    the node is not under suspicion, or was reported by a workload).
    """
    said = f" ({test.message})" if test.message else ""
    reruns_done = test.attempt if test.reason == ScreeningReason.CONFIRMATION else 0
    reruns_left = confirmation.reruns - reruns_done
    if test.verdict == Verdict.SDC:
        failed = test.failed_checks or frozenset({"unknown"})
        if not suspect_checks:
            if confirmation.reruns == 0:
                return Assessment(Outcome.CONFIRMED, failed, f"SDC in {test.name}{said}")
            return Assessment(Outcome.NEEDS_RERUN, failed, f"SDC in {test.name}{said}")
        if not confirmation.require_same_check or failed & suspect_checks:
            return Assessment(
                Outcome.CONFIRMED,
                suspect_checks | failed,
                f"SDC confirmed by {test.name}{said}",
            )
        again = Outcome.NEEDS_RERUN if reruns_left > 0 else Outcome.FLAKY
        return Assessment(
            again,
            suspect_checks | failed,
            f"{test.name} failed {', '.join(sorted(failed))}, not the suspected "
            f"{', '.join(sorted(suspect_checks))}{said}",
        )
    if test.verdict == Verdict.PASS:
        if not clears(suspect_checks, test.passed_checks):
            missing = ", ".join(sorted(suspect_checks - test.passed_checks))
            return Assessment(
                Outcome.INCONCLUSIVE,
                suspect_checks,
                f"{test.name} passed but did not run the suspected {missing}",
            )
        if suspect_checks and test.reason == ScreeningReason.CONFIRMATION:
            if reruns_left > 0:
                return Assessment(
                    Outcome.NEEDS_RERUN,
                    suspect_checks,
                    f"re-run {test.name} passed; {reruns_left} more to go",
                )
            return Assessment(
                Outcome.FLAKY,
                suspect_checks,
                f"all {confirmation.reruns} re-runs passed after SDC in "
                f"{', '.join(sorted(suspect_checks))}",
            )
        return Assessment(Outcome.CLEARED, frozenset(), f"{test.name} passed{said}")
    verdict = test.verdict.value if test.verdict else test.phase.value
    return Assessment(Outcome.INCONCLUSIVE, suspect_checks, f"{test.name}: {verdict}{said}")


def backoff_seconds(base_seconds: float, inconclusive_count: int) -> float:
    """Wait after the ``inconclusive_count``-th inconclusive result in a row: doubling, at most
    16 times the base."""
    factor: int = min(16, 2 ** max(0, inconclusive_count - 1))
    return base_seconds * factor


def retry_time(now: dt.datetime, base_seconds: float, inconclusive_count: int) -> dt.datetime:
    """When to screen again after an inconclusive result."""
    return now + dt.timedelta(seconds=backoff_seconds(base_seconds, inconclusive_count))
