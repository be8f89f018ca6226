"""Shell completion for ``kubectl sdc``, driven by the command's own argparse parser.

One engine answers every shell: ``kubectl-sdc __complete WORD... PARTIAL`` prints the
candidates for PARTIAL, one a line, then ``:N``, a directive in the format of the cobra
library that kubectl is built on (4: do not fall back to file names). It serves:

* ``kubectl sdc completion bash|zsh``: scripts for the ``kubectl-sdc`` command, which
  call the engine with the words typed so far;
* ``kubectl_complete-sdc``: kubectl (1.26 and later) runs an executable of that name on
  PATH, with the words after ``kubectl sdc``, to complete a plugin's arguments inside
  kubectl's own completion; it expects exactly this format.

Subcommands, flags and flag values come from the parser, so completion cannot drift from
the commands. NODE, TICKET and ID arguments and ``--policy`` are completed from the cluster
(names only, with a short timeout, honouring ``--kubeconfig`` and ``--context`` on the
line); when the cluster cannot be asked, they simply complete nothing.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TextIO

from sdcguard.api import GROUP, PLURAL_HARDWARE, PLURAL_POLICIES, PLURAL_TICKETS, VERSION

if TYPE_CHECKING:
    from sdcguard.cli.kube import Connection

# The kubernetes client and the plugin's API module are imported only when a completion
# asks the cluster: every TAB starts a process, and most completions need neither.

DIRECTIVE_DEFAULT = 0
"""Let the shell complete file names when there is no candidate (``--kubeconfig``)."""
DIRECTIVE_NO_FILE = 4
"""Never fall back to file names."""
LOOKUP_SECONDS = 3.0
"""How long a completion may wait for the API server before it gives up."""
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
"""Asks the API server for names and metadata only: a large fleet's Nodes are not sent whole."""

# Which objects an argument names, by its metavar in the parser.
ARGUMENT_OBJECTS: dict[str, tuple[str, ...]] = {
    "NODE": ("nodes",),
    "TICKET": (PLURAL_TICKETS,),
    "NODE|TICKET": ("nodes", PLURAL_TICKETS),
    "ID": (PLURAL_HARDWARE, "nodes"),
}
FLAG_OBJECTS: dict[str, tuple[str, ...]] = {"--policy": (PLURAL_POLICIES,)}
SHELLS = ("bash", "zsh")

Lookup = Callable[[tuple[str, ...], str | None, str | None], list[str]]
"""(plurals, kubeconfig, context) -> names of the objects."""


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {flag: a for a in parser._actions for flag in a.option_strings}


def _positionals(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        a
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def complete(
    parser: argparse.ArgumentParser, words: Sequence[str], lookup: Lookup
) -> tuple[list[str], int]:
    """The candidates for the last of ``words`` (the words after the program name; the last
    is the one being completed, "" for a new word) and the cobra directive."""
    *done, partial = list(words) or [""]
    commands = _subcommands(parser)
    current = parser
    command: str | None = None
    expecting: argparse.Action | None = None
    given: dict[str, str] = {}
    positionals = 0
    for word in done:
        if expecting is not None:
            given[expecting.dest] = word
            expecting = None
            continue
        if word.startswith("-") and word != "-":
            flag, eq, value = word.partition("=")
            action = _options(current).get(flag) or _options(parser).get(flag)
            if action is not None and eq:
                given[action.dest] = value
            elif action is not None and _takes_value(action):
                expecting = action
            continue
        if command is None:
            if word in commands:
                command, current = word, commands[word]
            continue
        positionals += 1

    def values(action: argparse.Action, flag: str, prefix: str = "") -> tuple[list[str], int]:
        if action.choices is not None:
            names = [str(c) for c in action.choices]
        elif flag == "--context":
            names = _contexts(given.get("kubeconfig"))
        elif flag == "--kubeconfig":
            return [], DIRECTIVE_DEFAULT
        elif flag in FLAG_OBJECTS:
            names = lookup(FLAG_OBJECTS[flag], given.get("kubeconfig"), given.get("context"))
        else:
            names = []
        typed = partial[len(prefix) :]
        return [prefix + n for n in names if n.startswith(typed)], DIRECTIVE_NO_FILE

    if expecting is not None:
        flag = next(f for f in expecting.option_strings if f.startswith("--"))
        return values(expecting, flag)
    if partial.startswith("-"):
        flag, eq, _ = partial.partition("=")
        options = {**_options(parser), **_options(current)}
        if eq and flag in options:
            return values(options[flag], flag, prefix=flag + "=")
        flags = sorted(f for f, a in options.items() if a.help != argparse.SUPPRESS)
        return [f for f in flags if f.startswith(partial)], DIRECTIVE_NO_FILE
    if command is None:
        return sorted(c for c in commands if c.startswith(partial)), DIRECTIVE_NO_FILE
    wanted = _positionals(current)
    if positionals >= len(wanted):
        return [], DIRECTIVE_NO_FILE
    argument = wanted[positionals]
    if argument.choices is not None:
        names = [str(c) for c in argument.choices]
    else:
        plurals = ARGUMENT_OBJECTS.get(str(argument.metavar), ())
        names = lookup(plurals, given.get("kubeconfig"), given.get("context")) if plurals else []
    return sorted({n for n in names if n.startswith(partial)}), DIRECTIVE_NO_FILE


def _contexts(kubeconfig: str | None) -> list[str]:
    from kubernetes import config

    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        contexts, _ = config.list_kube_config_contexts(  # type: ignore[no-untyped-call]
            config_file=path
        )
    except (config.ConfigException, OSError):
        return []
    return [str(c["name"]) for c in contexts or [] if "name" in c]


def _names(conn: Connection, plural: str) -> list[str]:
    from sdcguard.cli.kube import call, item_names

    headers = {"Accept": METADATA_ONLY}
    timeout = LOOKUP_SECONDS
    if plural == "nodes":
        body = call(
            conn, conn.core.list_node, plural=plural, _headers=headers, _request_timeout=timeout
        )
    else:
        body = call(
            conn,
            conn.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            plural,
            plural=plural,
            _headers=headers,
            _request_timeout=timeout,
        )
    return item_names(body)


def cluster_lookup(
    plurals: tuple[str, ...], kubeconfig: str | None, context: str | None
) -> list[str]:
    """Names of the objects of ``plurals`` in the cluster; nothing when it cannot be asked
    (completion must never print an error into the command line)."""
    from pydantic import ValidationError

    from sdcguard.cli.kube import CliError, connect

    try:
        conn = connect(kubeconfig, context)
        return [name for plural in plurals for name in _names(conn, plural)]
    except (CliError, ValidationError, TypeError):  # TypeError: a client without _headers
        return []


def answer(
    parser: argparse.ArgumentParser,
    words: Sequence[str],
    out: TextIO,
    lookup: Lookup = cluster_lookup,
) -> None:
    """Print the candidates and the directive in cobra's ``__complete`` format."""
    candidates, directive = complete(parser, words, lookup)
    for candidate in candidates:
        out.write(candidate + "\n")
    out.write(f":{directive}\n")


BASH = r"""# bash completion for kubectl-sdc (kubectl sdc), from `kubectl sdc completion bash`.
# Load it with: source <(kubectl-sdc completion bash)
_kubectl_sdc() {
    local cur="${COMP_WORDS[COMP_CWORD]}" IFS=$'\n' out directive
    out=$("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null) || return
    directive="${out##*:}"
    out="${out%:*}"
    COMPREPLY=($(compgen -W "${out}" -- "${cur}"))
    if [[ ${#COMPREPLY[@]} -eq 0 && $((directive & 4)) -eq 0 ]]; then
        COMPREPLY=($(compgen -f -- "${cur}"))
    fi
}
complete -F _kubectl_sdc kubectl-sdc
"""

ZSH = r"""#compdef kubectl-sdc
# zsh completion for kubectl-sdc (kubectl sdc), from `kubectl sdc completion zsh`.
# Load it with: source <(kubectl-sdc completion zsh)   (after compinit), or install it
# as a completion function: kubectl-sdc completion zsh > "${fpath[1]}/_kubectl-sdc"
_kubectl_sdc() {
    local -a out candidates
    local directive
    out=("${(@f)$("${words[1]}" __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
    directive="${out[-1]#:}"
    candidates=("${(@)out[1,-2]}")
    candidates=("${(@)candidates:#}")
    if (( ${#candidates} )); then
        compadd -- "${candidates[@]}"
    elif (( (directive & 4) == 0 )); then
        _files
    fi
}
if [[ "${funcstack[1]}" == "_kubectl-sdc" ]]; then
    _kubectl_sdc "$@"
else
    compdef _kubectl_sdc kubectl-sdc
fi
"""

SCRIPTS = {"bash": BASH, "zsh": ZSH}
