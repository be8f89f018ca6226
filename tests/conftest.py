"""Shared fixtures: the real local control plane, and a guard for unit tests.

Tests under tests/cluster/ and tests/e2e/ (or any test using the ``cluster``
fixture) talk to a real kube-apiserver, scheduler and controller-manager
started once per session. Every other test runs with outgoing HTTP blocked,
so a unit test that accidentally reaches for an API server fails loudly.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from sdcdev.cluster.localcluster import LocalCluster

# make test runs its groups side by side, some niced, on busy cores: how long one
# example, or drawing it, takes measures the machine, not the code. Every property test
# gets no deadline and no slow-generation check unless it sets its own.
settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

LIVE_DIRS = ("cluster", "e2e")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        parts = Path(str(item.fspath)).parts
        if "e2e" in parts:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.cluster)
        elif "cluster" in parts or "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """With ``SUITE_CPU_LOG`` set (``tests/run-suites.sh`` sets it with SUITE_LOG_DIR),
    one JSON line per test: its wall time, this process's CPU during it (the test, the
    simulator's threads) and its ended child processes' (probe runs, operators, tools
    started and reaped within it). ``python -m bench.suite.testcpu`` ranks them. The
    last test's teardown ends the session's fixtures (the control plane, reaped with
    all the CPU it spent): that part is a line of its own, ``SESSION_TEARDOWN``."""
    log = os.environ.get("SUITE_CPU_LOG")
    if not log:
        yield
        return
    start = _usage()
    yield
    end = _usage()
    ended = item.stash.get(_SESSION_ENDED, None)
    lines = [(item.nodeid, start, ended[0] if ended else end)]
    if ended:
        lines.append((SESSION_TEARDOWN, ended[0], ended[1]))
    with open(log, "a") as out:
        for test, (w0, s0, c0), (w1, s1, c1) in lines:
            row = {
                "test": test,
                "wall_s": w1 - w0,
                "self_cpu_s": s1 - s0,
                "children_cpu_s": c1 - c0,
            }
            out.write(json.dumps({k: v if k == "test" else round(v, 3) for k, v in row.items()}))
            out.write("\n")


SESSION_TEARDOWN = "(session teardown)"
"""The line of the session's shared fixtures' end, in a SUITE_CPU_LOG."""
_SESSION_ENDED = pytest.StashKey[tuple[tuple[float, float, float], tuple[float, float, float]]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The last test's teardown, measured apart (see pytest_runtest_protocol)."""
    if nextitem is not None or not os.environ.get("SUITE_CPU_LOG"):
        yield
        return
    start = _usage()
    yield
    item.stash[_SESSION_ENDED] = (start, _usage())


def _usage() -> tuple[float, float, float]:
    return time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.fixture(autouse=True)
def _no_api_calls_in_unit_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("cluster") is not None:
        yield
        return
    import urllib3.connectionpool

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(
            "unit test tried to reach an API server; mark it as a cluster test "
            "or pass a fake client"
        )

    mp = pytest.MonkeyPatch()
    mp.setattr(urllib3.connectionpool.HTTPConnectionPool, "urlopen", refuse)
    try:
        yield
    finally:
        mp.undo()


def _running_pids(needle: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if needle in cmdline:
            pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    """A started control plane; yields the LocalCluster (``.kubeconfig``, ``.server``)."""
    c = LocalCluster()
    with c:
        os.environ["SDCGUARD_TEST_KUBECONFIG"] = str(c.kubeconfig)
        state_dir = str(c.state_dir)
        yield c
    leftovers = _running_pids(state_dir)
    assert not leftovers, f"control-plane processes left after teardown: {leftovers}"


@pytest.fixture(scope="session")
def api_client(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    """A kubernetes.client.ApiClient with admin rights on the local cluster."""
    from kubernetes import config

    return config.new_client_from_config(str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def crds(api_client) -> None:  # type: ignore[no-untyped-def]
    """The project's CRDs installed and served, and the operator's namespace."""
    from sdcdev.harness import apply_crds, ensure_namespace

    apply_crds(api_client)
    ensure_namespace(api_client)
