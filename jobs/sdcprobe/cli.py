"""Command line: ``sdcprobe run | baseline | fingerprint``.

Exit codes: 0 pass, 1 SDC detected, 2 inconclusive (infrastructure error, bad
arguments, baseline under another fingerprint). stdout carries exactly one JSON
document (result, baseline or fingerprint); everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import NoReturn

from sdcprobe import attest
from sdcprobe.config import (
    CHECK_NAMES,
    DEFAULT_CATCH_FRACTION,
    DEFAULT_CATCH_TARGET,
    MAX_DWELL_S,
)
from sdcprobe.faultspec import FaultSpec, FaultSpecError, parse_fault_spec
from sdcprobe.result import (
    TERMINATION_LIMIT,
    Baseline,
    ProbeResult,
    ResultError,
    encode_for_termination,
    parse_baseline,
)
from sdcprobe.runner import RunOptions, run_probe
from sdcprobe.trace import step_digest

EXIT_PASS, EXIT_FAIL, EXIT_INCONCLUSIVE = 0, 1, 2
TERMINATION_LOG = "/dev/termination-log"


class UsageError(Exception):
    """Arguments or inputs that make the run impossible (exit 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _checks(text: str) -> list[str]:
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHECK_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown check(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {','.join(CHECK_NAMES)}"
        )
    return names


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


#: Seeds are non-negative 31-bit integers (what every device's generators accept alike).
MAX_SEED = (1 << 31) - 1
#: Below this no run can start its workers, warm up and run one round of everything.
MIN_BUDGET_S = 3.0


def _seed(text: str) -> int:
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer between 0 and {MAX_SEED}, got {text!r}"
        ) from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be between 0 and {MAX_SEED}, got {value}")
    return value


def _budget(text: str) -> float:
    value = _positive_float(text)
    if value < MIN_BUDGET_S:
        raise argparse.ArgumentTypeError(
            f"{value:g}s is too small: starting the device workers, warming up and one "
            f"round of every check need at least {MIN_BUDGET_S:g}s"
        )
    return value


def _probability(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be strictly between 0 and 1, got {value}")
    return value


def _dwell(text: str) -> float:
    value = float(text)
    if not 0 <= value <= MAX_DWELL_S:
        raise argparse.ArgumentTypeError(
            f"must be between 0 and {MAX_DWELL_S:g} seconds, got {value}"
        )
    return value


def _stress(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 600:
        raise argparse.ArgumentTypeError(f"must be between 0 and 600 seconds, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 0.95:
        raise argparse.ArgumentTypeError(f"must be in (0, 0.95], got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of all subcommands."""
    parser = _Parser(
        prog="sdcprobe", description="Screen this node's accelerators for silent data corruption."
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--device", choices=["auto", "cpu", "cuda", "xla"], default="auto")
        p.add_argument(
            "--cpu-devices",
            type=_positive_int,
            default=2,
            help="CPU replicas (separate processes) standing in for devices (cpu and XLA:CPU)",
        )
        p.add_argument(
            "--budget",
            type=_budget,
            default=60.0,
            help="wall time in seconds the run plans to fill (and not exceed)",
        )
        p.add_argument(
            "--seed",
            type=_seed,
            default=0,
            help=f"seed of the rounds a baseline covers, 0..{MAX_SEED} (baselines are per seed)",
        )
        p.add_argument(
            "--data-seed",
            type=_seed,
            default=None,
            help="the screening's own seed for every round after those a baseline covers "
            "(default: --seed); not part of the fingerprint",
        )
        p.add_argument("--steps", type=_positive_int, default=None, help="golden training steps")
        p.add_argument(
            "--timeout",
            type=_positive_float,
            default=None,
            help="hard limit for the workers (default max(4 x budget, budget + 120))",
        )
        p.add_argument(
            "--threads", type=_positive_int, default=1, help="intra-op threads per device worker"
        )
        p.add_argument(
            "--memory-fraction",
            type=_fraction,
            default=None,
            help="share of free accelerator memory the memory check fills (default 0.8)",
        )
        p.add_argument(
            "--memory-dwell",
            type=_dwell,
            default=None,
            help="seconds each memory pattern sits unread before read-back (retention "
            "faults; default 0.25 on accelerators, 0.05 on CPU replicas)",
        )
        p.add_argument(
            "--stress-seconds",
            type=_stress,
            default=None,
            help="longest time the warm-up holds the device busy until power and temperature "
            "settle, before the peaks are measured (default 30 on CUDA, 0 elsewhere)",
        )
        p.add_argument(
            "--memory-mib",
            type=_positive_int,
            default=None,
            help="MiB per device for the memory check instead (default 64 on CPU replicas)",
        )

    run = sub.add_parser("run", help="run the checks and report a verdict")
    common(run)
    run.add_argument(
        "--catch-target",
        type=_probability,
        default=DEFAULT_CATCH_TARGET,
        help="catch chance every check should reach for a fault active in --catch-fraction "
        f"of rounds (default {DEFAULT_CATCH_TARGET:g})",
    )
    run.add_argument(
        "--catch-fraction",
        type=_probability,
        default=DEFAULT_CATCH_FRACTION,
        help="share of rounds the target's fault is active in "
        f"(default {DEFAULT_CATCH_FRACTION:g})",
    )
    run.add_argument(
        "--catch-shortfall",
        choices=["flag", "refuse"],
        default="flag",
        help="when the budget cannot reach the target: run and report it (flag), or stop "
        "before the checks, inconclusive (refuse)",
    )
    run.add_argument("--checks", type=_checks, default=list(CHECK_NAMES), help="comma-separated")
    run.add_argument(
        "--result-file", default=None, help=f"termination message (default {TERMINATION_LOG})"
    )
    run.add_argument(
        "--baseline", default=None, help="baseline JSON file (or env SDCPROBE_BASELINE)"
    )
    run.add_argument("--faults", default=None, help="fault spec JSON file (or env SDCPROBE_FAULTS)")
    run.add_argument(
        "--allow-fault-injection",
        action="store_true",
        help="required for any fault spec to take effect (tests and benchmarks only)",
    )
    run.add_argument(
        "--deadline",
        type=_positive_float,
        default=None,
        help="the Job's activeDeadlineSeconds: the budget must fit in it",
    )

    base = sub.add_parser("baseline", help="run healthy and print a baseline document")
    common(base)
    base.add_argument("--checks", type=_checks, default=list(CHECK_NAMES), help="comma-separated")

    fp = sub.add_parser("fingerprint", help="print this node's fingerprint")
    common(fp)
    return parser


def _log(message: str) -> None:
    print(f"sdcprobe: {message}", file=sys.stderr, flush=True)


def _result_file(args: argparse.Namespace | None) -> str | None:
    explicit = getattr(args, "result_file", None) if args is not None else None
    if explicit:
        return str(explicit)
    return TERMINATION_LOG if os.path.exists(TERMINATION_LOG) else None


def _termination_text(result: ProbeResult) -> str:
    """The termination message: the squeezed result, sealed with the screening's key
    when the operator mounted one (``sdcprobe.attest``)."""
    try:
        sealing = attest.load()
    except ValueError as exc:
        _log(f"result not sealed: {exc}")
        sealing = None
    if sealing is None:
        return encode_for_termination(result)
    text = encode_for_termination(result, TERMINATION_LIMIT - attest.OVERHEAD)
    return attest.seal(text, *sealing)


def emit(result: ProbeResult, result_file: str | None) -> int:
    """Print the full result, write the termination message, return the exit code."""
    print(result.model_dump_json(), flush=True)
    if result_file:
        try:
            Path(result_file).write_text(_termination_text(result))
        except OSError as exc:
            _log(f"cannot write result file {result_file}: {exc}")
    _log(f"{result.verdict}: {result.reason}")
    return result.exit_code()


def _load_faults(args: argparse.Namespace) -> FaultSpec | None:
    env = os.environ.get("SDCPROBE_FAULTS", "").strip()
    if args.faults and env:
        raise UsageError("a fault spec was given twice (--faults and SDCPROBE_FAULTS): give one")
    if args.faults:
        try:
            text, origin = Path(args.faults).read_text(), f"fault spec {args.faults}"
        except OSError as exc:
            raise UsageError(f"cannot read --faults {args.faults}: {exc.strerror}") from exc
    elif env:
        text, origin = env, "fault spec in SDCPROBE_FAULTS"
    else:
        return None
    if not args.allow_fault_injection:
        raise UsageError(
            f"{origin} requests fault injection but --allow-fault-injection was not given; "
            "refusing to run (fault injection is for tests and benchmarks only)"
        )
    try:
        return parse_fault_spec(text, origin)
    except FaultSpecError as exc:
        raise UsageError(str(exc)) from exc


def _load_baseline(args: argparse.Namespace) -> Baseline | None:
    env = os.environ.get("SDCPROBE_BASELINE", "").strip()
    if args.baseline and env:
        raise UsageError("a baseline was given twice (--baseline and SDCPROBE_BASELINE): give one")
    if args.baseline:
        try:
            text, origin = Path(args.baseline).read_text(), f"--baseline {args.baseline}"
        except OSError as exc:
            raise UsageError(f"cannot read --baseline {args.baseline}: {exc.strerror}") from exc
    elif env:
        text, origin = env, "SDCPROBE_BASELINE"
    else:
        return None
    try:
        return parse_baseline(text)
    except ResultError as exc:
        raise UsageError(f"{origin}: {exc.reason}") from exc


def _options(args: argparse.Namespace) -> RunOptions:
    return RunOptions(
        device=args.device,
        checks=getattr(args, "checks", list(CHECK_NAMES)),
        cpu_devices=args.cpu_devices,
        budget=args.budget,
        seed=args.seed,
        data_seed=args.data_seed,
        image=os.environ.get("SDCPROBE_IMAGE", "").strip()[:512],
        steps=args.steps,
        threads=args.threads,
        memory_fraction=args.memory_fraction,
        memory_mib=args.memory_mib,
        memory_dwell=args.memory_dwell,
        stress=args.stress_seconds,
        timeout=getattr(args, "timeout", None),
        deadline=getattr(args, "deadline", None),
        catch_target=getattr(args, "catch_target", DEFAULT_CATCH_TARGET),
        catch_fraction=getattr(args, "catch_fraction", DEFAULT_CATCH_FRACTION),
        catch_shortfall=getattr(args, "catch_shortfall", "flag"),
    )


class Terminated(Exception):
    """SIGTERM arrived (Pod deadline, eviction): stop workers, report inconclusive."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated(f"terminated by signal {signum} before the checks finished")


def cmd_run(args: argparse.Namespace) -> int:
    """``sdcprobe run``."""
    started = time.perf_counter()
    opts = _options(args)
    opts.started = started
    if opts.deadline is not None and opts.budget > opts.deadline:
        raise UsageError(
            f"--budget {opts.budget:g}s is larger than the Job's deadline {opts.deadline:g}s: "
            "the Pod would be killed before the plan is done; lower the budget or raise "
            "activeDeadlineSeconds"
        )
    opts.faults = _load_faults(args)
    opts.baseline = _load_baseline(args)
    if opts.faults is not None:
        count = len(opts.faults.faults)
        _log(f"FAULT INJECTION ENABLED: {count} fault(s); this is not a screening")
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = run_probe(opts).result
    except Terminated as exc:  # the runner has already stopped its workers
        elapsed = round(time.perf_counter() - started, 3)
        result = ProbeResult(verdict="inconclusive", reason=str(exc), duration_s=elapsed)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return emit(result, _result_file(args))


def cmd_baseline(args: argparse.Namespace) -> int:
    """``sdcprobe baseline``: a healthy run's digests as a baseline document on stdout."""
    if os.environ.get("SDCPROBE_FAULTS", "").strip():
        raise UsageError("SDCPROBE_FAULTS is set: a baseline is recorded from a healthy run only")
    run = run_probe(_options(args))
    result = run.result
    if result.verdict != "pass" or result.fingerprint is None:
        print(result.model_dump_json(), file=sys.stderr)
        _log(f"no baseline recorded: run was {result.verdict}: {result.reason}")
        return result.exit_code()
    first = run.reports[min(run.reports)]
    assert first is not None
    covered = run.config.baseline_rounds
    baseline = Baseline(
        fingerprint=result.fingerprint,
        seed=run.config.seed,
        # Check digests cover the rounds every plan runs (baseline_rounds).
        digests={name: check.digest for name, check in result.checks.items() if check.digest},
        step_digests={
            name: [step_digest(items) for items in trace.steps[: covered.get(name)]]
            for name, trace in first.checks.items()
        },
    )
    print(baseline.model_dump_json(), flush=True)
    fp_hash = result.fingerprint.hash[:12]
    _log(f"baseline recorded for fingerprint {fp_hash} ({result.duration_s:.1f}s)")
    return EXIT_PASS


def cmd_fingerprint(args: argparse.Namespace) -> int:
    """``sdcprobe fingerprint``: this node's fingerprint as JSON (in this process)."""
    from sdcprobe.backends import setup_backend
    from sdcprobe.devices import (
        apply_determinism_env,
        ensure_pjrt_device,
        local_device_count,
        resolve_backend,
    )
    from sdcprobe.fingerprint import device_facts
    from sdcprobe.judge import build_fingerprint

    apply_determinism_env()
    backend_name = resolve_backend(args.device)
    if backend_name == "xla":
        ensure_pjrt_device()
    opts = _options(args)
    count = local_device_count(backend_name, args.cpu_devices)
    backend = setup_backend(backend_name, 0, args.threads)
    if count is None:
        import torch_xla.runtime as xr

        count = xr.global_runtime_device_count()
    fingerprint = build_fingerprint([device_facts(backend)], count, opts.config(backend_name))
    print(json.dumps(fingerprint.model_dump(mode="json")), flush=True)
    return EXIT_PASS


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m sdcprobe``; returns the exit code."""
    started = time.perf_counter()
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "baseline":
            return cmd_baseline(args)
        return cmd_fingerprint(args)
    except UsageError as exc:
        _log(f"error: {exc}")
        command = getattr(args, "command", None) if args is not None else _guess_command(argv)
        if command == "run":
            result = ProbeResult(
                verdict="inconclusive",
                reason=f"bad arguments: {exc}",
                duration_s=round(time.perf_counter() - started, 3),
            )
            emit(result, _result_file(args) if args is not None else _guess_result_file(argv))
        return EXIT_INCONCLUSIVE


def _argv(argv: list[str] | None) -> list[str]:
    return list(sys.argv[1:] if argv is None else argv)


def _guess_command(argv: list[str] | None) -> str | None:
    return next((a for a in _argv(argv) if a in ("run", "baseline", "fingerprint")), None)


def _guess_result_file(argv: list[str] | None) -> str | None:
    """The result file of an argument list that failed to parse (best effort)."""
    args = _argv(argv)
    for i, arg in enumerate(args):
        if arg == "--result-file" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--result-file="):
            return arg.split("=", 1)[1]
    return TERMINATION_LOG if os.path.exists(TERMINATION_LOG) else None
