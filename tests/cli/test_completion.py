"""kubectl sdc's conventions without a cluster: shell completion (the engine, and bash and
zsh driven through tmux), -o wide, --no-headers, and the krew manifest."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from sdcguard.cli import main
from sdcguard.cli.completion import (
    DIRECTIVE_DEFAULT,
    DIRECTIVE_NO_FILE,
    complete,
)
from sdcguard.cli.main import build_parser, kubectl_complete
from sdcguard.cli.output import Result, Table, emit, render_table
from tests.cli.tmuxshell import BASH_COMPLETION, need, plugin_bin, shell

ROOT = Path(__file__).resolve().parents[2]
KREW = ROOT / "charts" / "krew"

LookupCall = tuple[tuple[str, ...], str | None, str | None]


class FakeCluster:
    """Names per plural, and the lookups asked of it (no API server in unit tests)."""

    def __init__(self) -> None:
        self.names = {
            "nodes": ["gpu-1", "gpu-2", "cpu-1"],
            "repairtickets": ["gpu-2-1"],
            "sdcpolicies": ["gpus", "tpus"],
            "sdchardwares": ["hw-0abc"],
        }
        self.calls: list[LookupCall] = []

    def __call__(self, plurals: tuple[str, ...], kubeconfig: str | None, context: str | None):
        self.calls.append((plurals, kubeconfig, context))
        return [n for p in plurals for n in self.names[p]]


def candidates(line: str, cluster: FakeCluster | None = None) -> tuple[list[str], int]:
    """Completion of the last word of ``line`` (a trailing space starts a new word)."""
    words = line.split(" ")
    return complete(build_parser(), words, cluster or FakeCluster())


def test_commands_flags_and_values_come_from_the_parser() -> None:
    assert candidates("st") == (["status"], DIRECTIVE_NO_FILE)
    assert "completion" in candidates("")[0] and "blast-radius" in candidates("")[0]
    assert candidates("-o ")[0] == ["table", "wide", "json", "yaml"]
    assert candidates("status -o w")[0] == ["wide"]
    assert candidates("--output=y")[0] == ["--output=yaml"]
    assert candidates("test gpu-1 --s")[0] == ["--seed", "--suite"]
    assert candidates("test gpu-1 --suite r")[0] == ["requalification", "repairVerification"]
    assert candidates("repaired t --resolution F")[0] == ["FalseAlarm"]
    assert candidates("completion ")[0] == ["bash", "zsh"]
    # the global flags after the command too, as the parser accepts them there
    assert {"--context", "--kubeconfig", "--no-headers", "--output"} <= set(
        candidates("history gpu-1 --")[0]
    )
    assert candidates("--kubeconfig ") == ([], DIRECTIVE_DEFAULT)  # file names


def test_names_come_from_the_cluster_with_the_flags_on_the_line() -> None:
    cluster = FakeCluster()
    assert candidates("history gpu", cluster)[0] == ["gpu-1", "gpu-2"]
    assert candidates("repaired ", cluster)[0] == ["gpu-2-1"]
    assert candidates("blast-radius gpu-2", cluster)[0] == ["gpu-2", "gpu-2-1"]
    assert candidates("hardware hw", cluster)[0] == ["hw-0abc"]
    assert candidates("test gpu-1 --policy g", cluster)[0] == ["gpus"]
    assert candidates("--kubeconfig /k --context lab quarantine c", cluster)[0] == ["cpu-1"]
    assert cluster.calls[-1] == (("nodes",), "/k", "lab")
    # one NODE only: nothing after it, and the cluster is not asked again
    asked = len(cluster.calls)
    assert candidates("history gpu-1 ", cluster)[0] == []
    assert len(cluster.calls) == asked


def test_contexts_come_from_the_kubeconfig(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": n, "context": {"cluster": "c", "user": "u"}}
                    for n in ("prod", "lab", "prod-eu")
                ],
                "current-context": "lab",
            }
        )
    )
    assert candidates(f"--kubeconfig {kubeconfig} --context pr")[0] == ["prod", "prod-eu"]


def test_complete_answers_in_kubectls_format() -> None:
    out = io.StringIO()
    assert main(["__complete", "status", "-o", "j"], stdout=out) == 0
    assert out.getvalue() == "json\n:4\n"
    # the entry point a kubectl_complete-sdc console script would name
    out = io.StringIO()
    assert kubectl_complete(["st"], out) == 0
    assert out.getvalue() == "status\n:4\n"


@pytest.mark.parametrize("shell_name", ["bash", "zsh"])
def test_completion_scripts_are_printed(shell_name: str) -> None:
    out = io.StringIO()
    assert main(["completion", shell_name], stdout=out) == 0
    assert "kubectl-sdc" in out.getvalue() and "__complete" in out.getvalue()


def _env(folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
    env["PATH"] = os.pathsep.join([str(plugin_bin(folder / "bin")), env["PATH"]])
    env["KUBECONFIG"] = str(folder / "no-kubeconfig")  # names come from no cluster here
    env["HOME"] = str(folder)
    return env


def test_bash_completes_kubectl_sdc(tmp_path: Path) -> None:
    need("bash")
    rc = tmp_path / "bashrc"
    rc.write_text("PS1='sdc-bash> '\nsource <(kubectl-sdc completion bash)\n")
    argv = ["bash", "--noprofile", "--rcfile", str(rc), "-i"]
    with shell(argv, _env(tmp_path), tmp_path, "sdc-bash>") as sh:
        sh.complete("kubectl-sdc st", "sdc-bash> kubectl-sdc status")
        shown = sh.complete("kubectl-sdc -o ", "wide", tabs=2)
        assert "json" in shown and "yaml" in shown
        sh.complete("kubectl-sdc history gpu-1 --no-h", "kubectl-sdc history gpu-1 --no-headers")


@pytest.mark.parametrize("install", ["source", "fpath"])
def test_zsh_completes_kubectl_sdc(tmp_path: Path, install: str) -> None:
    """Sourced, or installed as the completion function _kubectl-sdc on $fpath."""
    need("zsh")
    functions = tmp_path / "functions"
    functions.mkdir()
    out = io.StringIO()
    main(["completion", "zsh"], stdout=out)
    (functions / "_kubectl-sdc").write_text(out.getvalue())
    rc = ["PS1='sdc-zsh> '"]
    if install == "fpath":
        rc.append(f"fpath=({functions} $fpath)")
    rc.append("autoload -U compinit && compinit -u")
    if install == "source":
        rc.append("source <(kubectl-sdc completion zsh)")
    (tmp_path / ".zshrc").write_text("\n".join(rc) + "\n")
    env = {**_env(tmp_path), "ZDOTDIR": str(tmp_path)}
    with shell(["zsh", "-i"], env, tmp_path, "sdc-zsh>") as sh:
        sh.complete("kubectl-sdc st", "sdc-zsh> kubectl-sdc status")
        shown = sh.complete("kubectl-sdc test gpu-1 --suite ", "requalification")
        assert "acceptance" in shown


# ---------------------------------------------------------------- -o wide, --no-headers


def test_wide_columns_and_no_headers() -> None:
    table = Table(
        ["name", "phase", "hash"],
        [["t-1", "Passed", "ab12"], ["long-name", "Running", "cd34"]],
        title="Tests:",
        empty="No tests.",
        wide=["hash"],
    )
    assert render_table(table) == (
        "Tests:\nNAME        PHASE\nt-1         Passed\nlong-name   Running"
    )
    assert render_table(table, wide=True).splitlines()[1] == "NAME        PHASE     HASH"
    assert render_table(table, headers=False) == "t-1         Passed\nlong-name   Running"
    assert render_table(Table(["x"], [], empty="No tests."), headers=False) == ""
    out = io.StringIO()
    emit(Result(data=[], tables=[table]), "wide", out, headers=False)
    assert out.getvalue() == "t-1         Passed    ab12\nlong-name   Running   cd34\n"
    with pytest.raises(ValueError, match="not headers"):
        render_table(Table(["x"], [["1"]], wide=["y"]))


@pytest.mark.parametrize(
    "argv",
    [
        ["--no-headers", "-o", "wide", "baselines"],
        ["baselines", "--no-headers", "-o", "wide"],
        ["-o", "wide", "baselines", "--no-headers"],
    ],
)
def test_no_headers_and_wide_before_or_after_the_command(argv: list[str]) -> None:
    args = build_parser().parse_args(argv)
    assert args.no_headers is True and args.output == "wide"
    assert build_parser().parse_args(["baselines"]).no_headers is False


# ---------------------------------------------------------------- krew


def _archive_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("krew_archive", KREW / "archive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_krew_manifest_names_the_archive_it_installs() -> None:
    manifest = yaml.safe_load((KREW / "sdc.yaml").read_text())
    assert manifest["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2"
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "sdc"
    data = _archive_module().build()
    assert data == _archive_module().build()  # the same bytes every time
    names = zipfile.ZipFile(io.BytesIO(data)).namelist()
    for platform in manifest["spec"]["platforms"]:
        assert platform["sha256"] == hashlib.sha256(data).hexdigest(), (
            "charts/krew changed: run python3 charts/krew/archive.py --update"
        )
        assert platform["bin"] in names
        assert {f["from"] for f in platform["files"]} <= set(names)
        assert platform["selector"]["matchExpressions"][0]["key"] == "os"
    modes = {
        i.filename: i.external_attr >> 16 for i in zipfile.ZipFile(io.BytesIO(data)).infolist()
    }
    assert all(mode & 0o111 for mode in modes.values()), modes


def test_the_launcher_runs_the_plugin_from_the_checkout(tmp_path: Path) -> None:
    """A symlink onto PATH is the simplest install from a checkout: the launcher finds the
    checkout it lies in."""
    import subprocess
    import sys

    link = tmp_path / "kubectl-sdc"
    link.symlink_to(KREW / "kubectl-sdc")
    env = {**os.environ, "SDCGUARD_PYTHON": sys.executable, "PYTHONPATH": ""}
    proc = subprocess.run(
        [str(link), "__complete", "sta"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "status\n:4\n"


def test_kubectl_plugin_completion_in_bash_needs_bash_completion() -> None:
    """Documents the prerequisite the cluster test of `kubectl sdc <TAB>` checks for."""
    if not BASH_COMPLETION.is_file():
        pytest.skip("bash-completion is not installed (apt-get install -y bash-completion)")
    assert "_get_comp_words_by_ref" in BASH_COMPLETION.read_text()
