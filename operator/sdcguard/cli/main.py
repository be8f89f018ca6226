"""Argument parsing and dispatch for ``kubectl sdc``."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from sdcguard.api import Resolution, Suite
from sdcguard.cli import completion
from sdcguard.cli.output import FORMATS, Result, emit

# The commands (and the kubernetes client under them) are imported once the command line
# is parsed: a completion, which starts a process per TAB, needs only the parser.

EPILOG = """\
Manual requests are node annotations the operator acts on; every request is also
recorded as an Event on the Node (kubectl describe node NODE).

Install as a kubectl plugin: pip install sdcguard puts kubectl-sdc on PATH. From a
checkout: python3 charts/krew/archive.py sdc.zip, then kubectl krew install
--manifest=charts/krew/sdc.yaml --archive=sdc.zip; or symlink charts/krew/kubectl-sdc
onto PATH (charts/krew/README.md).
Shell completion: source <(kubectl-sdc completion bash) (or zsh). For `kubectl sdc`
itself (kubectl 1.26+), put charts/krew/kubectl_complete-sdc on PATH as well.
Docs: https://github.com/sdcguard/sdcguard/tree/main/charts/sdcguard#kubectl-plugin
"""


def _global_flags(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The connection and output flags. They are accepted before and after the command,
    as kubectl's are; after it, an absent flag must not overwrite one given before it,
    so the command's copies have no defaults (argparse.SUPPRESS leaves the value alone)."""

    def default(value: str | None) -> str | None:
        return value if defaults else argparse.SUPPRESS

    parser.add_argument(
        "--kubeconfig",
        default=default(None),
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)",
    )
    parser.add_argument(
        "--context", default=default(None), help="kubeconfig context (default: the current one)"
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=FORMATS,
        default=default("table"),
        help="output format: table, wide (more columns), json or yaml (default: table)",
    )
    parser.add_argument(
        "--no-headers",
        action="store_true",
        default=False if defaults else argparse.SUPPRESS,
        help="tables without titles and column headers, for scripts (as kubectl's)",
    )


def _positive_int(text: str) -> int:
    """A count of at least 1 (argparse prints the message as a usage error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"{value} is not a count; give 1 or more, or leave --limit out to see everything"
        )
    return value


def build_parser() -> argparse.ArgumentParser:
    """The command line: global connection/output flags (before or after the command) and one
    subparser per command."""
    common = argparse.ArgumentParser(add_help=False)
    _global_flags(common, defaults=False)
    parser = argparse.ArgumentParser(
        prog="kubectl sdc",
        description="Inspect and steer sdcguard, the silent-data-corruption screening operator.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _global_flags(parser, defaults=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser(
        "status",
        parents=[common],
        help="fleet summary by state and pool, circuit breakers, open tickets",
    )

    sub.add_parser(
        "fleet",
        parents=[common],
        help="failures per hardware type, onset to quarantine, re-certification, exposure",
    )

    test = sub.add_parser(
        "test", parents=[common], help="screen a node now (creates an SDCTest, reason Manual)"
    )
    test.add_argument("node", metavar="NODE")
    test.add_argument(
        "--suite",
        choices=[s.value for s in Suite],
        default=None,
        help="checks to run (default: acceptance for a node that never qualified, "
        "requalification otherwise)",
    )
    test.add_argument("--policy", help="SDCPolicy to use (default: the one covering the node)")
    test.add_argument(
        "--seed",
        type=_seed,
        default=None,
        help="pin the seed of the probe's baseline rounds, 0..2147483647 (default: the fixed "
        "baseline seed; also pins --data-seed unless given)",
    )
    test.add_argument(
        "--data-seed",
        type=_seed,
        default=None,
        help="pin the seed of every later round, 0..2147483647 (default: a new one per test)",
    )

    for action, text in (
        ("quarantine", "ask the operator to quarantine a node (taint, cordon, ticket)"),
        ("release", "ask the operator to return a quarantined node to service"),
    ):
        p = sub.add_parser(action, parents=[common], help=text)
        p.add_argument("node", metavar="NODE")
        p.add_argument("--reason", required=True, help="why (kept on the node and in an Event)")

    repaired = sub.add_parser(
        "repaired", parents=[common], help="record the repair side's resolution of a RepairTicket"
    )
    repaired.add_argument("ticket", metavar="TICKET")
    repaired.add_argument("--note", required=True, help="what was done")
    repaired.add_argument(
        "--resolution",
        choices=[r.value for r in Resolution],
        default=Resolution.REPAIRED.value,
        help="Repaired, Replaced, FalseAlarm (all verified before return) or Retire "
        "(default: Repaired)",
    )

    hist = sub.add_parser(
        "history", parents=[common], help="a node's tests, tickets and events, by time"
    )
    hist.add_argument("node", metavar="NODE")
    hist.add_argument(
        "--limit",
        type=_positive_int,
        default=None,
        help="show only the latest N entries, N >= 1 (default: all)",
    )

    baselines = sub.add_parser(
        "baselines",
        parents=[common],
        help="golden-value baselines per hardware fingerprint (approve: trust candidate digests)",
    )
    baselines_sub = baselines.add_subparsers(dest="baselines_command", metavar="ACTION")
    approve = baselines_sub.add_parser(
        "approve",
        parents=[common],
        help="trust a fingerprint's candidate digests: how a pool smaller than the quorum "
        "qualifies (shows them and who produced them, then asks)",
    )
    approve.add_argument(
        "fingerprint",
        metavar="FINGERPRINT",
        nargs="?",
        default=None,
        help="the SDCBaseline's name, fingerprint hash or its first 8+ characters",
    )
    approve.add_argument(
        "--node", help="approve this node's digests (of its latest screening) instead"
    )
    approve.add_argument("--yes", action="store_true", help="approve without asking")
    approve.add_argument(
        "--as",
        dest="approver",
        default=None,
        help="who approves, as recorded on the baseline (default: your API user)",
    )
    hw = sub.add_parser(
        "hardware",
        parents=[common],
        help="failure history by hardware identity, across tickets and Node names",
    )
    hw.add_argument(
        "id",
        metavar="ID",
        nargs="?",
        default=None,
        help="an SDCHardware name, a providerID / system UUID / machine ID, or a Node name",
    )
    blast = sub.add_parser(
        "blast-radius",
        parents=[common],
        help="workloads that used a node since its last passing screening (a ticket's window)",
    )
    blast.add_argument("name", metavar="NODE|TICKET")
    cleanup = sub.add_parser(
        "cleanup",
        parents=[common],
        help="before helm uninstall (operator stopped): release every node sdcguard holds, "
        "except those quarantined for their hardware, and cancel tests in flight",
    )
    cleanup.add_argument("--yes", action="store_true", help="go on without asking")
    cleanup.add_argument(
        "-l",
        "--selector",
        default=None,
        help="only nodes with these labels (kubectl's label selector) and their tests",
    )
    cleanup.add_argument(
        "--stop-operator",
        metavar="NAMESPACE/DEPLOYMENT",
        default=None,
        help="scale the operator's Deployment to zero and wait for its Pods first, then "
        "take Kopf's finalizer off every SDCPolicy (the chart's pre-delete hook does this)",
    )
    cleanup.add_argument(
        "--jobs-namespace",
        metavar="NAMESPACE",
        default=None,
        help="look for probe Jobs only in the operator's namespace (default: every namespace)",
    )
    sub.add_parser(
        "migrate-storage",
        parents=[common],
        help="after an upgrade that changed the stored API version: write every sdcguard "
        "object again in it, then narrow the CRDs' storedVersions",
    )
    shell = sub.add_parser(
        "completion",
        help="print the shell completion script (source <(kubectl-sdc completion bash))",
    )
    shell.add_argument("shell", metavar="SHELL", choices=completion.SHELLS, help="bash or zsh")
    return parser


def _seed(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer between 0 and 2147483647, got {text!r}"
        ) from None
    if not 0 <= value <= 2147483647:
        raise argparse.ArgumentTypeError(f"must be between 0 and 2147483647, got {value}")
    return value


Confirm = Callable[[list[str]], bool]


def run(args: argparse.Namespace, confirm: Confirm | None = None) -> Result:
    """Execute the parsed command; ``confirm`` shows what a write will do and says whether
    to go on (None: go on, as with --yes)."""
    from sdcguard.cli import blast, commands
    from sdcguard.cli.kube import CliError, connect, whoami

    conn = connect(args.kubeconfig, args.context)
    if args.command == "status":
        return commands.status(conn)
    if args.command == "fleet":
        from sdcguard.cli.fleet import fleet

        return fleet(conn)
    if args.command == "test":
        suite = Suite(args.suite) if args.suite else None
        return commands.start_test(conn, args.node, suite, args.policy, args.seed, args.data_seed)
    if args.command in ("quarantine", "release"):
        return commands.request_action(conn, args.command, args.node, args.reason)
    if args.command == "repaired":
        return commands.resolve_ticket(conn, args.ticket, Resolution(args.resolution), args.note)
    if args.command == "history":
        return commands.history(conn, args.node, args.limit)
    if args.command == "baselines" and getattr(args, "baselines_command", None) == "approve":
        from sdcguard.cli.approve import approve_baseline

        if args.fingerprint is None and args.node is None:
            raise CliError("name a FINGERPRINT or a node (--node NODE)")
        return approve_baseline(
            conn,
            args.fingerprint,
            args.node,
            args.approver or whoami(conn),
            confirm or (lambda _lines: True),
            dt.datetime.now(dt.UTC),
        )
    if args.command == "baselines":
        return commands.baselines(conn)
    if args.command == "cleanup":
        from sdcguard.cli.cleanup import cleanup

        return cleanup(
            conn,
            confirm or (lambda _lines: True),
            dt.datetime.now(dt.UTC),
            args.selector,
            stop=args.stop_operator,
            jobs_namespace=args.jobs_namespace,
        )
    if args.command == "hardware":
        return commands.hardware(conn, args.id)
    if args.command == "blast-radius":
        return blast.blast_radius(conn, args.name)
    if args.command == "migrate-storage":
        from sdcguard.cli.migrate import migrate_storage

        return migrate_storage(conn)
    raise CliError(f"unknown command {args.command}")  # argparse prevents this


def _ask(err: TextIO, stdin: TextIO | None) -> Confirm:
    """A confirmation on the terminal: the summary on stderr, then y/N from stdin. Without
    a terminal (a script, a pipe) nothing is asked and the write is refused: --yes says so."""

    def confirm(lines: list[str]) -> bool:
        from sdcguard.cli.kube import CliError

        source = stdin or sys.stdin
        for line in lines:
            err.write(line + "\n")
        if stdin is None and not source.isatty():
            raise CliError("nothing was changed: no terminal to ask on; add --yes to go on")
        err.write("go on? [y/N] ")
        err.flush()
        answer = source.readline().strip().lower()
        return answer in ("y", "yes")

    return confirm


def main(
    argv: Sequence[str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    stdin: TextIO | None = None,
) -> int:
    """Entry point of ``kubectl-sdc``; returns the exit status (0 ok, 1 failed, 2 usage)."""
    out = stdout or sys.stdout
    err = stderr or sys.stderr
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if words[:1] == ["__complete"]:  # the completion scripts and kubectl_complete-sdc
        completion.answer(parser, words[1:], out)
        return 0
    args = parser.parse_args(words)
    if args.command == "completion":
        out.write(completion.SCRIPTS[args.shell])
        return 0
    from sdcguard.cli.kube import CliError

    try:
        result = run(args, None if getattr(args, "yes", True) else _ask(err, stdin))
    except CliError as exc:
        err.write(f"error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        err.write("interrupted\n")
        return 130
    if args.output in ("table", "wide"):
        warnings = [line for line in result.lines if line.startswith("warning:")]
        for line in warnings:
            err.write(line + "\n")
        result.lines = [line for line in result.lines if line and line not in warnings]
    else:
        for line in result.lines:
            if line.startswith("warning:"):
                err.write(line + "\n")
    emit(result, args.output, out, headers=not args.no_headers)
    return 0


def kubectl_complete(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Entry point of ``kubectl_complete-sdc``: kubectl passes the words after
    ``kubectl sdc`` (the last being completed) and reads cobra's format back."""
    completion.answer(
        build_parser(), list(sys.argv[1:] if argv is None else argv), out or sys.stdout
    )
    return 0
