"""kubectl sdc without a cluster: policy choice, fleet summary, history order, the manual
request contract, error messages and output formats."""

from __future__ import annotations

import datetime as dt
import io
import json
import tomllib
from importlib import import_module
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from sdcguard.api import RepairTicket, SDCHardware, SDCPolicy, SDCTest
from sdcguard.cli import commands, main
from sdcguard.cli.kube import CRDS_MISSING, CliError, Listing, explain
from sdcguard.cli.objects import Event, Node
from sdcguard.cli.output import Result, Table, age, emit, render_table
from sdcguard.domain import keys

ROOT = Path(__file__).resolve().parents[2]


def node(name: str, labels: dict[str, str] | None = None, gpus: int = 8, **spec: Any) -> Node:
    return Node.from_body(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": str(gpus)} if gpus else {}},
        }
    )


def sdctest(name: str, spec: dict[str, Any], **rest: Any) -> SDCTest:
    """An SDCTest as the API server would return it (nodeName and policyRef filled in)."""
    return SDCTest.model_validate(
        {
            "metadata": {"name": name, **rest.pop("metadata", {})},
            "spec": {"nodeName": "n1", "policyRef": "p", **spec},
            **rest,
        }
    )


def policy(name: str, match: dict[str, str] | None = None, pool: str | None = None) -> SDCPolicy:
    return SDCPolicy.model_validate(
        {
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": match or {}}, "budgets": {"poolLabel": pool}},
        }
    )


def test_console_script_points_at_main() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, attr = scripts["kubectl-sdc"].partition(":")
    assert getattr(import_module(module), attr) is main


def test_most_specific_policy_covers_a_node() -> None:
    everything, a100 = policy("all"), policy("a100", {"pool": "a100"})
    n = node("n1", {"pool": "a100"})
    assert commands.select_policy([everything, a100], n) is a100
    assert commands.select_policy([everything, a100], node("n2")) is everything
    assert commands.select_policy([a100], node("cpu-only", {"pool": "a100"}, gpus=0)) is None
    with pytest.raises(CliError, match="covered by policies a100, b100; choose one with --policy"):
        commands.select_policy([a100, policy("b100", {"pool": "a100"})], n)


def test_fleet_summary_by_policy_pool_and_state() -> None:
    policies = [policy("gpus", {"team": "ml"}, pool="node.kubernetes.io/instance-type")]
    labels = {"team": "ml", "node.kubernetes.io/instance-type": "p5"}
    nodes = [
        node("a", {**labels, keys.LABEL_STATE: "Qualified"}),
        node("b", {**labels, keys.LABEL_STATE: "Quarantined"}),
        node("c", {**labels, keys.LABEL_STATE: "Qualified", "sdcguard.dev/overdue": "true"}),
        node("d", labels),  # covered, not labelled yet
        node("e", {keys.LABEL_STATE: "Retired"}),  # labelled, no policy any more
        node("f", {}),  # not part of the fleet
        # registered gated, waiting for its acceptance test (which labels it)
        node("g", labels, taints=[{"key": "sdcguard.dev/unqualified", "effect": "NoSchedule"}]),
    ]
    summary = commands.summarize_fleet(nodes, policies)
    assert summary.nodes == 6
    assert summary.states == {
        "Unqualified": 1,
        "Qualified": 2,
        "Quarantined": 1,
        "Retired": 1,
        "New": 1,
    }
    assert summary.pools == [
        {"policy": "-", "pool": "-", "nodes": 1, "overdue": 0, "states": {"Retired": 1}},
        {
            "policy": "gpus",
            "pool": "p5",
            "nodes": 5,
            "overdue": 1,  # past maxQualificationAge, labelled by the operator
            "states": {"Unqualified": 1, "Qualified": 2, "Quarantined": 1, "New": 1},
        },
    ]


def test_request_annotations_follow_the_contract() -> None:
    ann = commands.request_annotations("quarantine", "loss spikes", "alice", "id-1")
    assert ann == {
        keys.REQUEST_QUARANTINE: "loss spikes",
        keys.REQUEST_RELEASE: None,  # a newer request withdraws the opposite one
        "sdcguard.dev/request": "quarantine",
        "sdcguard.dev/request-reason": "loss spikes",
        "sdcguard.dev/request-by": "alice",
        "sdcguard.dev/request-id": "id-1",
    }
    release = commands.request_annotations("release", "fixed", "bob", "id-2")
    assert release[keys.REQUEST_RELEASE] == "fixed" and release[keys.REQUEST_QUARANTINE] is None


def test_history_is_time_ordered_across_kinds() -> None:
    tests = [
        sdctest(
            "t2",
            {"suite": "requalification", "reason": "Manual"},
            metadata={"creationTimestamp": "2025-01-02T00:00:00Z"},
            status={
                "phase": "Failed",
                "verdict": "SDC",
                "completionTime": "2025-01-02T00:10:00Z",
                "checks": [{"name": "golden", "verdict": "SDC", "oddDevice": 3}],
            },
        ),
        sdctest(
            "t1",
            {"suite": "acceptance", "reason": "Join"},
            metadata={"creationTimestamp": "2025-01-01T00:00:00Z"},
        ),
    ]
    tickets = [
        RepairTicket.model_validate(
            {
                "metadata": {"name": "k1"},
                "spec": {"nodeName": "n"},
                "status": {
                    "cycle": 1,
                    "history": [
                        {"time": "2025-01-02T00:11:00Z", "phase": "Open", "message": "quarantined"},
                        {"time": "2025-01-03T00:00:00Z", "phase": "InRepair"},
                    ],
                },
            }
        )
    ]
    events = [
        Event.model_validate(
            {
                "metadata": {"creationTimestamp": "2025-01-02T00:05:00Z"},
                "involvedObject": {"kind": "Node", "name": "n"},
                "reason": "ManualQuarantineRequested",
                "message": "alice asked",
                "type": "Warning",
                "lastTimestamp": "2025-01-02T00:05:00Z",
            }
        )
    ]
    entries = commands.history_entries(tests, tickets, events)
    assert [(e["kind"], e["name"]) for e in entries] == [
        ("SDCTest", "t1"),
        ("Event", "Node/n"),
        ("SDCTest", "t2"),
        ("RepairTicket", "k1"),
        ("RepairTicket", "k1"),
    ]
    assert "verdict SDC" in entries[2]["detail"] and "golden=SDC(device 3)" in entries[2]["detail"]


def _api_exception(status: int, body: str) -> ApiException:
    exc = ApiException(status=status, reason="x")
    exc.body = body
    return exc


def test_errors_are_short_and_actionable() -> None:
    missing = _api_exception(
        404, json.dumps({"kind": "Status", "details": {"name": "gpu-9", "kind": "nodes"}})
    )
    assert str(explain(missing, "nodes", "gpu-9", "https://k")) == (
        "node gpu-9 not found; list nodes with kubectl get nodes"
    )
    ticket = _api_exception(404, json.dumps({"details": {"name": "t", "kind": "repairtickets"}}))
    assert "list tickets with kubectl get repairtickets" in str(
        explain(ticket, "repairtickets", "t", "https://k")
    )
    no_crds = _api_exception(404, "404 page not found")
    assert str(explain(no_crds, "sdcpolicies", None, "https://k")) == CRDS_MISSING
    assert "helm install sdcguard charts/sdcguard" in CRDS_MISSING
    forbidden = _api_exception(403, json.dumps({"message": 'nodes "x" is forbidden'}))
    assert str(explain(forbidden, "nodes", "x", "https://k")).startswith("forbidden: nodes")
    invalid = _api_exception(
        422,
        json.dumps({"details": {"causes": [{"message": "spec.resolution: Retire is final"}]}}),
    )
    assert "Retire is final" in str(explain(invalid, "repairtickets", "t", "https://k"))


def test_missing_kubeconfig_is_explained(tmp_path: Path) -> None:
    err = io.StringIO()
    code = main(["status", "--kubeconfig", str(tmp_path / "nope")], stderr=err)
    assert code == 1
    assert (
        err.getvalue()
        == f"error: kubeconfig {tmp_path / 'nope'} does not exist; check --kubeconfig\n"
    )


def test_unreachable_server_is_explained(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    from urllib3.exceptions import MaxRetryError

    from sdcguard.cli import kube

    conn = kube.connect(str(kubeconfig), None)
    assert conn.kubeconfig_user == "u" and conn.server == "http://127.0.0.1:1"

    def refused(*args: object, **kwargs: object) -> None:
        raise MaxRetryError(None, "/api/v1/nodes", ConnectionRefusedError(111, "refused"))  # type: ignore[arg-type]

    with pytest.raises(CliError) as err:
        kube.call(conn, refused, plural="nodes")
    assert str(err.value).startswith("cannot reach the API server at http://127.0.0.1:1")
    assert "kubectl cluster-info" in str(err.value)


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["quarantine", "gpu-1"])
    assert exit_.value.code == 2
    assert "--reason" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["test", "gpu-1", "--suite", "quick"])


def test_table_json_and_yaml_output() -> None:
    result = Result(
        data={"a": 1},
        tables=[Table(["name", "phase"], [["t-1", "Passed"], ["long-name", "Running"]])],
        lines=["done."],
    )
    out = io.StringIO()
    emit(result, "table", out)
    assert out.getvalue() == (
        "NAME        PHASE\nt-1         Passed\nlong-name   Running\n\ndone.\n"
    )
    out = io.StringIO()
    emit(result, "json", out)
    assert json.loads(out.getvalue()) == {"a": 1}
    out = io.StringIO()
    emit(result, "yaml", out)
    assert yaml.safe_load(out.getvalue()) == {"a": 1}
    assert render_table(Table(["x"], [], empty="nothing")) == "nothing"


def test_age_like_kubectl() -> None:
    import datetime as dt

    now = dt.datetime(2025, 1, 10, tzinfo=dt.UTC)
    assert [age(now - dt.timedelta(seconds=s), now) for s in (5, 600, 18000, 4 * 86400)] == [
        "5s",
        "10m",
        "5h",
        "4d",
    ]
    assert age(None, now) == "<unknown>"


def _with(meta: dict[str, Any], name: str = "n1") -> Node:
    return Node.from_body({"metadata": {"name": name, **meta}})


def test_default_suite_follows_the_nodes_record() -> None:
    fresh = _with({"labels": {}})
    gated = _with({"labels": {keys.LABEL_STATE: "Unqualified"}})
    qualified = _with(
        {
            "labels": {keys.LABEL_STATE: "Qualified"},
            "annotations": {keys.QUALIFIED_AT: "2025-01-01"},
        }
    )
    assert commands.default_suite(fresh)[0] == "acceptance"
    assert commands.default_suite(gated)[0] == "acceptance"
    assert commands.default_suite(qualified)[0] == "requalification"


def test_running_test_prefers_the_one_the_node_names() -> None:
    node = _with({"annotations": {keys.CURRENT_TEST: "n1-rq-2"}})
    tests = [
        sdctest("n1-acc-1", {}, status={"phase": "Passed"}),
        sdctest("n1-manual-a", {}),
        sdctest("n1-rq-2", {}, status={"phase": "Running"}),
        sdctest("n2-rq-1", {"nodeName": "n2"}, status={"phase": "Running"}),
    ]
    assert commands.running_test(node, tests) == ("n1-rq-2", "Running")
    assert commands.running_test(_with({}), tests[:2]) == ("n1-manual-a", "Pending")
    assert commands.running_test(_with({}), tests[:1]) is None


@pytest.mark.parametrize(
    ("state", "refused"),
    [
        ("Testing", "is Testing"),
        ("Qualified", "is Qualified: there is nothing to release"),
        ("Quarantined", None),
        ("Repairing", None),
        ("Suspect", None),
        ("Unqualified", None),
        ("Excluded", None),
        (None, None),
        ("Nonsense", None),
    ],
)
def test_release_is_refused_where_it_would_be_undone(
    state: str | None, refused: str | None
) -> None:
    labels = {keys.LABEL_STATE: state} if state else {}
    why = commands.release_refusal(_with({"labels": labels}))
    assert (why is None) if refused is None else (why is not None and refused in why)


def test_history_names_the_suite_that_ran_for_a_test_that_named_none() -> None:
    tests = [
        sdctest(
            "t1",
            {"reason": "Manual"},
            metadata={"creationTimestamp": "2025-01-01T00:00:00Z"},
            status={"phase": "Running", "suite": "acceptance"},
        ),
        sdctest("t2", {"reason": "Manual"}, metadata={"creationTimestamp": "2025-01-02T00:00:00Z"}),
    ]
    entries = commands.history_entries(tests, [], [])
    assert entries[0]["suite"] == "acceptance"
    assert entries[0]["detail"].startswith("acceptance (Manual): Running")
    assert entries[1]["detail"].startswith("suite not chosen yet (Manual): Pending")


def test_hardware_lists_records_and_finds_one_by_node_id_or_past_name(monkeypatch) -> None:
    from sdcguard.api import IdentityKind
    from sdcguard.cli.output import render_table
    from sdcguard.domain.hardware import record_name

    provider = "aws:///us-east-1a/i-0abc"
    record = {
        "metadata": {
            "name": record_name(IdentityKind.PROVIDER_ID, provider),
            "creationTimestamp": "2025-06-01T10:00:00Z",
        },
        "spec": {"kind": "ProviderID", "id": provider},
        "status": {
            "failures": [
                {
                    "time": "2025-06-01T10:00:00Z",
                    "kind": "Quarantined",
                    "node": "old-1",
                    "ticket": "old-1-t",
                    "test": "old-1-s",
                },
                {
                    "time": "2025-06-02T10:00:00Z",
                    "kind": "Retired",
                    "node": "new-1",
                    "ticket": "new-1-t",
                    "test": "new-1-s",
                },
            ],
            "totalFailures": 2,
            "nodes": [
                {"node": n, "firstSeen": t, "lastSeen": t}
                for n, t in (("old-1", "2025-06-01T10:00:00Z"), ("new-1", "2025-06-02T10:00:00Z"))
            ],
            "lastNode": "new-1",
            "retired": {"time": "2025-06-02T10:00:00Z", "node": "new-1", "message": "done"},
            "untrusted": [{"kind": "SystemUUID", "value": "", "reason": "empty"}],
        },
    }
    node_body = Node.from_body({"metadata": {"name": "new-1"}, "spec": {"providerID": provider}})
    listed = Listing([SDCHardware.model_validate(record)])
    monkeypatch.setattr(commands, "list_typed", lambda conn, model, plural: listed)

    def get_node(conn: Any, name: str) -> Node:
        if name == "new-1":
            return node_body
        raise CliError(f"node {name} not found")

    monkeypatch.setattr(commands, "get_node", get_node)
    everything = commands.hardware(None, None)  # type: ignore[arg-type]
    assert [r["totalFailures"] for r in everything.data] == [2]
    table = render_table(everything.tables[0])
    assert "ProviderID" in table and "old-1,new-1" in table
    for wanted in ("new-1", provider.upper(), "old-1", record["metadata"]["name"]):
        found = commands.hardware(None, wanted)  # type: ignore[arg-type]
        assert [r["id"] for r in found.data] == [provider], wanted
    detail = commands.hardware(None, "new-1")  # type: ignore[arg-type]
    text = "\n".join(render_table(t) for t in detail.tables)
    assert "Retired" in text and "empty" in text and "kubectl delete sdchardware" in detail.lines[0]
    with pytest.raises(CliError, match="no hardware history for 'gpu-9'"):
        commands.hardware(None, "gpu-9")  # type: ignore[arg-type]


def _two_contexts(tmp_path: Path) -> Path:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "prod", "context": {"cluster": "c", "user": "u"}},
                    {"name": "lab", "context": {"cluster": "c", "user": "u"}},
                ],
                "current-context": "prod",
            }
        )
    )
    return kubeconfig


def test_an_unknown_context_lists_the_contexts_there_are(tmp_path: Path) -> None:
    kubeconfig = _two_contexts(tmp_path)
    err = io.StringIO()
    code = main(["status", "--kubeconfig", str(kubeconfig), "--context", "staging"], stderr=err)
    assert code == 1
    assert err.getvalue() == (
        f"error: context 'staging' is not in kubeconfig {kubeconfig}; its contexts: lab, "
        "prod (current). Pick one with --context (kubectl config get-contexts lists them)\n"
    )


def test_a_known_context_is_used(tmp_path: Path) -> None:
    from sdcguard.cli import kube

    conn = kube.connect(str(_two_contexts(tmp_path)), "lab")
    assert conn.kubeconfig_user == "u" and conn.server == "http://127.0.0.1:1"


class _PagedLists:
    """``list_cluster_custom_object`` over ``items``, two a page, answering a field
    selector with ``refuse`` (400, as a server without the CRD's selectableFields does)
    or, when None, by the ``spec.nodeName=X`` it names; records each request."""

    def __init__(self, items: list[dict[str, Any]], refuse: bool = False) -> None:
        self.items, self.refuse, self.requests = items, refuse, []

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **kw: Any) -> Any:

        self.requests.append(kw)
        selector = kw.get("field_selector")
        if selector and self.refuse:
            raise ApiException(status=400, reason='field label not supported: "spec.nodeName"')
        items = [
            i
            for i in self.items
            if not selector or f"spec.nodeName={i['spec']['nodeName']}" == selector
        ]
        start = int(kw.get("_continue") or 0)
        end = start + min(kw["limit"], 2)
        meta = {"continue": str(end)} if end < len(items) else {}
        return SimpleNamespace(data=json.dumps({"items": items[start:end], "metadata": meta}))


def _ticket_body(name: str, node: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"nodeName": node}}


def test_a_list_follows_its_pages_and_asks_the_server_to_select() -> None:
    from sdcguard.cli import kube

    bodies = [_ticket_body(f"k{i}", "n1" if i % 2 else "n2") for i in range(7)]
    api = _PagedLists(bodies)
    conn = SimpleNamespace(custom=api, server="https://x")
    listed = kube.list_typed(conn, RepairTicket, "repairtickets")  # type: ignore[arg-type]
    assert [t.metadata.name for t in listed.items] == [f"k{i}" for i in range(7)]
    assert len(api.requests) == 4 and all(r["limit"] == kube.LIST_PAGE for r in api.requests)
    api.requests.clear()
    on_n1 = commands.on_node("n1", RepairTicket)
    listed = kube.list_typed(conn, RepairTicket, "repairtickets", on_n1)  # type: ignore[arg-type]
    assert [t.metadata.name for t in listed.items] == ["k1", "k3", "k5"]
    assert {r["field_selector"] for r in api.requests} == {"spec.nodeName=n1"}


def test_a_server_that_cannot_select_gets_the_whole_list_filtered_here() -> None:
    """CRDs applied by an older chart have no selectableFields: the server answers the
    selector 400, and the plugin lists everything and keeps what it asked for."""
    from sdcguard.cli import kube

    bodies = [_ticket_body(f"k{i}", "n1" if i % 2 else "n2") for i in range(5)]
    api = _PagedLists(bodies, refuse=True)
    conn = SimpleNamespace(custom=api, server="https://x")
    on_n1 = commands.on_node("n1", RepairTicket)
    listed = kube.list_typed(conn, RepairTicket, "repairtickets", on_n1)  # type: ignore[arg-type]
    assert [t.metadata.name for t in listed.items] == ["k1", "k3"]
    assert api.requests[0]["field_selector"] == "spec.nodeName=n1"
    assert all("field_selector" not in r for r in api.requests[1:])


def test_the_selectors_ask_for_unfinished_tests_and_open_tickets() -> None:
    tests = commands.unfinished_tests()
    assert tests.field_selector == (
        "status.phase!=Passed,status.phase!=Failed,status.phase!=Inconclusive,"
        "status.phase!=Cancelled"
    )
    spec = {"nodeName": "n", "policyRef": "p"}
    pending = SDCTest.model_validate({"metadata": {"name": "t"}, "spec": spec})
    passed = SDCTest.model_validate(
        {"metadata": {"name": "t"}, "spec": spec, "status": {"phase": "Passed"}}
    )
    assert tests.keep(pending) and not tests.keep(passed)
    tickets = commands.open_tickets()
    assert tickets.field_selector == "status.phase!=Closed,status.phase!=Retired"
    assert tickets.keep(RepairTicket.model_validate(_ticket_body("k", "n")))


def test_an_object_that_does_not_decode_is_left_out_with_a_warning() -> None:
    """The CLI reads through the API models: one malformed object does not hide the rest,
    and the warning names it and its bad field."""
    from sdcguard.cli import kube

    good = {"metadata": {"name": "k1"}, "spec": {"nodeName": "n1"}}
    bad = {"metadata": {"name": "k2"}, "spec": {"nodeName": "n1", "resolution": "Fixed"}}
    conn = SimpleNamespace(custom=_PagedLists([good, bad]), server="https://x")
    listed = kube.list_typed(conn, RepairTicket, "repairtickets")  # type: ignore[arg-type]
    assert [t.metadata.name for t in listed.items] == ["k1"]
    (warning,) = listed.warnings
    assert warning.startswith("warning: left out: repairticket k2 does not match")
    assert "spec.resolution" in warning
    with pytest.raises(CliError, match=r"repairticket k2 does not match .*spec\.resolution"):
        kube.decode(RepairTicket, bad, "repairtickets")


def test_a_ticket_row_says_notified_only_once_a_delivery_is_recorded() -> None:
    import datetime as dt

    now = dt.datetime(2025, 1, 10, tzinfo=dt.UTC)

    def row(status: dict[str, Any]) -> dict[str, Any]:
        ticket = RepairTicket.model_validate(
            {"metadata": {"name": "k"}, "spec": {"nodeName": "n"}, "status": status}
        )
        return commands._ticket_row(ticket, now)

    assert row({"phase": "InRepair"})["delivered"] is None  # shown as "-"
    assert row({"notification": {"delivered": True}})["delivered"] is True
    opened = row({"openedAt": "2025-01-09T00:00:00Z", "cycle": 2})
    assert (opened["openedAt"], opened["ageSeconds"], opened["cycle"]) == (
        "2025-01-09T00:00:00Z",
        86400,
        2,
    )


def test_screenings_in_progress_show_budget_and_when_they_end() -> None:
    """`kubectl sdc status` lists running screenings with their budget and expected end,
    soonest first; finished tests are left out."""
    from sdcguard.cli.commands import _ends_in, _screening_rows

    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    running = sdctest(
        "t-run",
        {"reason": "Join"},
        status={
            "phase": "Running",
            "budgetSeconds": 900,
            "expectedEnd": "2026-01-01T12:20:00Z",
            "startTime": "2026-01-01T11:58:00Z",
        },
    )
    late = sdctest(
        "t-late",
        {"nodeName": "n2", "reason": "Expiry"},
        status={"phase": "Running", "budgetSeconds": 60, "expectedEnd": "2026-01-01T11:50:00Z"},
    )
    done = sdctest("t-done", {"reason": "Join"}, status={"phase": "Passed"})
    rows = _screening_rows([running, late, done], now)
    assert [r["name"] for r in rows] == ["t-late", "t-run"]
    assert rows[1]["budgetSeconds"] == 900
    assert _ends_in(rows[1]["expectedEnd"], now) == "in 20m"
    assert _ends_in(rows[0]["expectedEnd"], now) == "overdue 10m"
    assert _ends_in(None, now) == "-"


def test_history_names_a_missed_catch_target() -> None:
    from sdcguard.cli.commands import _test_entry

    test = sdctest(
        "t1",
        {"reason": "Expiry"},
        status={
            "phase": "Passed",
            "verdict": "Pass",
            "catchTargetMet": False,
            "catchShortfall": "compute reached 0.90 of 0.99; a budget of 1400s would reach it",
        },
    )
    entry = _test_entry(test)
    assert entry["catchTargetMet"] is False
    assert "catch target missed: compute reached 0.90" in entry["detail"]


def test_status_shows_topology_budgets_and_warns_about_a_key_on_no_node() -> None:
    policy = SDCPolicy.model_validate(
        {
            "metadata": {"name": "gb200"},
            "spec": {
                "budgets": {
                    "topology": [
                        {"labelKey": "nvidia.com/gpu.clique", "maxUnavailable": 1},
                        {"labelKey": "example.com/rack", "maxUnavailable": "10%"},
                        {"labelKey": "topology.kubernetes.io/zone", "maxUnavailable": 2},
                    ]
                }
            },
            "status": {
                "topology": [
                    {
                        "labelKey": "nvidia.com/gpu.clique",
                        "domains": 4,
                        "atLimit": 1,
                        "mostHeld": 1,
                    },
                    {"labelKey": "example.com/rack", "domains": 0},
                ]
            },
        }
    )
    rows = commands._topology_rows([policy])
    assert [(r["labelKey"], r["domains"], r["atLimit"], r["mostHeld"]) for r in rows] == [
        ("nvidia.com/gpu.clique", 4, 1, 1),
        ("example.com/rack", 0, 0, 0),
        ("topology.kubernetes.io/zone", None, None, None),  # not counted yet
    ]
    (warning,) = commands._topology_warnings(rows)
    assert "no node carries the label example.com/rack" in warning
