"""``python -m sdctrain megatron-report --exit-code N --tracker FILE``.

Reports this Pod's GPUs that Megatron-Core's rerun state machine flagged, then
exits with the training process's own exit code (so a wrapper script keeps it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sdctrain.megatron import detections_from_tracker, rank_info_from_env
from sdctrain.report import KubeReporter, report_body


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sdctrain")
    sub = parser.add_subparsers(dest="command", required=True)
    meg = sub.add_parser("megatron-report", help="report GPUs flagged by Megatron-Core")
    meg.add_argument("--exit-code", type=int, required=True, help="the training exit code")
    meg.add_argument("--tracker", type=Path, required=True, help="result_rejected_tracker file")
    meg.add_argument("--dry-run", action="store_true", help="print the reports, send nothing")
    args = parser.parse_args(argv)

    text = args.tracker.read_text(errors="replace") if args.tracker.is_file() else ""
    found = detections_from_tracker(args.exit_code, text, rank_info_from_env(os.environ))
    reporter = None if args.dry_run else KubeReporter.from_environment()
    for detection in found:
        if reporter is None:
            print(report_body(detection))
            continue
        try:
            print(f"sdctrain: reported {reporter.report(detection)}")
        except (OSError, RuntimeError, ValueError) as exc:
            print(f"sdctrain: report not delivered: {exc}", file=sys.stderr)
    if not found:
        print(f"sdctrain: nothing to report (exit code {args.exit_code})")
    return int(args.exit_code)


if __name__ == "__main__":
    sys.exit(main())
