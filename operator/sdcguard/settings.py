"""Operator settings from the environment (``SDCGUARD_*``), validated at start-up.

A wrong value stops the operator at once with pydantic's message naming the
variable, instead of surfacing as odd behaviour hours later.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from sdcguard.domain.reports import ReportLimits
from sdcguard.domain.retention import RetentionLimits


class Settings(BaseSettings):
    """Process-level configuration; per-fleet behaviour lives in SDCPolicy."""

    model_config = SettingsConfigDict(env_prefix="SDCGUARD_", extra="ignore", frozen=True)

    namespace: str = Field(
        default="sdcguard-system",
        description="Namespace where probe Jobs are created and the operator runs.",
    )
    default_probe_image: str = Field(
        default="ghcr.io/sdcguard/sdcprobe:0.1.0",
        description="Probe image used when a policy does not name one.",
    )
    probe_priority_class: str = Field(
        default="", description="PriorityClass for probe Pods (empty: none)."
    )
    probe_attestation_key_file: str = Field(
        default="",
        max_length=4096,
        description="File holding the operator's attestation key (hex, at least 16 bytes; "
        "the chart mounts one from a Secret it makes): each screening's probe seals its "
        "result with a nonce and key derived from it, and a result not sealed for its "
        "screening is Inconclusive (Unattested). Empty: results are not sealed.",
    )

    def attestation_key(self) -> bytes | None:
        """The attestation key's bytes, read from its file on every call so a rotated
        Secret is used (None: attestation is off). Raises ValueError for a file that is
        set but unreadable or not a key: a screening is then not started unsealed."""
        if not self.probe_attestation_key_file:
            return None
        try:
            text = Path(self.probe_attestation_key_file).read_text().strip()
            key = bytes.fromhex(text)
        except (OSError, ValueError) as exc:
            raise ValueError(f"attestation key file unreadable: {exc}") from exc
        if len(key) < 16:
            raise ValueError("the attestation key must hold at least 16 bytes")
        return key

    resync_seconds: float = Field(
        default=30.0, gt=0, description="Full re-evaluation period of every node."
    )
    debounce_seconds: float = Field(
        default=0.2, ge=0, description="Delay that batches bursts of watch events."
    )
    workload_record_seconds: float = Field(
        default=5.0,
        gt=0,
        description="How often changed workload records are written: at most one write "
        "per node in that time, however many Pods start and stop on it.",
    )
    routine_events: bool = Field(
        default=False,
        description="Also post Events for clean screenings (TestStarted, Qualified); "
        "the SDCTest records them either way.",
    )
    metrics_port: int = Field(default=8080, ge=0, le=65535, description="0 disables.")
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    dry_run: bool = Field(
        default=False, description="Decide and log, but send no mutating request at all."
    )
    api_timeout_seconds: float = Field(default=10.0, gt=0)
    leader_election: bool = Field(
        default=False,
        description="Run as one of several replicas: only the holder of the leader Lease "
        "acts; the others keep their copy of Nodes and Pods warm and take over when it "
        "stops renewing (runtime/leader.py).",
    )
    leader_lease_name: str = Field(
        default="sdcguard-leader", description="The Lease's name (in the namespace above)."
    )
    leader_identity: str = Field(
        default="",
        description="This replica's name in the Lease (the chart passes the Pod name); "
        "empty: the host name and process id.",
    )
    lease_duration_seconds: int = Field(
        default=8,
        ge=2,
        description="How long a standby waits, by its own clock, for an unchanged Lease "
        "before it takes over.",
    )
    renew_deadline_seconds: float = Field(
        default=5.0,
        gt=0,
        description="A leader that could not renew for this long stops acting and exits "
        "(shorter than the lease duration, so it stops before a standby may start).",
    )
    retry_period_seconds: float = Field(
        default=1.0, ge=1, description="How often the leader renews and a standby tries."
    )

    sink_allow_http: bool = Field(
        default=False, description="Let ticket sinks use http:// (test receivers only)."
    )
    sink_allow_loopback: bool = Field(
        default=False, description="Let ticket sinks reach loopback addresses (tests only)."
    )
    sink_denied_cidrs: str = Field(
        default="",
        description="Comma-separated CIDRs ticket sinks may not reach: the cluster's Pod "
        "and Service ranges (link-local and cloud-metadata addresses are always refused).",
    )
    sink_allowed_cidrs: str = Field(
        default="",
        description="Comma-separated CIDRs ticket sinks may reach although another rule "
        "refuses them (an in-cluster receiver run on purpose).",
    )

    @model_validator(mode="after")
    def _lease_times(self) -> Settings:
        # The client's election refuses anything else (its jitter is 1.2).
        if not (
            1.2 * self.retry_period_seconds
            < self.renew_deadline_seconds
            < self.lease_duration_seconds
        ):
            raise ValueError(
                "1.2 x SDCGUARD_RETRY_PERIOD_SECONDS < SDCGUARD_RENEW_DEADLINE_SECONDS < "
                "SDCGUARD_LEASE_DURATION_SECONDS must hold, got "
                f"{self.retry_period_seconds} / {self.renew_deadline_seconds} / "
                f"{self.lease_duration_seconds}"
            )
        return self

    report_window_seconds: float = Field(
        default=3600.0,
        gt=0,
        description="Window of the SDCReport caps below (per Job, nodes per Job, per namespace).",
    )
    report_per_job: int = Field(
        default=3, ge=1, description="SDCReports accepted per Job within the window."
    )
    report_max_nodes_per_job: int = Field(
        default=2,
        ge=1,
        description="Distinct nodes one Job may blame within the window (more: TooManyNodes).",
    )
    report_per_namespace: int = Field(
        default=10, ge=1, description="SDCReports accepted per namespace within the window."
    )
    report_node_window_seconds: float = Field(
        default=600.0,
        gt=0,
        description="A further report about a node reported this recently is evidence only "
        "(AlreadySuspected): it raises no second suspicion.",
    )
    report_per_cluster: int = Field(
        default=30, ge=1, description="SDCReports accepted in the whole cluster within the window."
    )
    report_pool_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Share of a pool's nodes that accepted SDCReports may hold awaiting their "
        "screening at once (at least one node); a pool is the nodes sharing the value of "
        "report_pool_label.",
    )
    report_pool_label: str = Field(
        default="node.kubernetes.io/instance-type",
        max_length=317,
        description="The node label whose value names a node's pool for report_pool_share "
        "(empty: the whole cluster is one pool).",
    )
    report_refused_per_reporter: int = Field(
        default=5,
        ge=1,
        description="Refused SDCReports per reporting Pod within the window after which its "
        "further reports are refused unread (Throttled).",
    )
    report_refused_per_namespace: int = Field(
        default=20, ge=1, description="The same as report_refused_per_reporter, per namespace."
    )
    report_refused_per_cluster: int = Field(
        default=100, ge=1, description="The same as report_refused_per_reporter, per cluster."
    )

    retention_tests_per_node: int = Field(
        default=10,
        ge=1,
        description="SDCTests kept per node whatever their age (the newest); older ones "
        "beyond this count go once they are older than retention_tests_days.",
    )
    retention_tests_days: float = Field(
        default=30.0,
        ge=1,
        description="SDCTests younger than this are kept, however many a node has.",
    )
    retention_closed_tickets_days: float = Field(
        default=365.0,
        ge=1,
        description="Closed RepairTickets are deleted this long after they closed (an "
        "open ticket never is; a Retired one only once its node has left the cluster).",
    )
    retention_reports_days: float = Field(
        default=30.0,
        ge=1,
        description="SDCReports are deleted this long after they were made (not while "
        "one awaits its outcome); so are WorkloadRecords of nodes that left the cluster.",
    )
    retention_baselines_days: float = Field(
        default=30.0,
        ge=1,
        description="An SDCBaseline whose fingerprint no node carries and no SDCTest "
        "ran under for this long is deleted.",
    )
    retention_deletes_per_second: float = Field(
        default=20.0,
        gt=0,
        description="Retention's deletes, at most this many a second (a token bucket).",
    )
    retention_interval_seconds: float = Field(
        default=600.0,
        ge=10,
        description="How often retention sweeps (on the leader only).",
    )

    def retention_limits(self) -> RetentionLimits:
        """The history bounds these settings set."""
        return RetentionLimits(
            tests_per_node=self.retention_tests_per_node,
            tests_age=dt.timedelta(days=self.retention_tests_days),
            closed_tickets_age=dt.timedelta(days=self.retention_closed_tickets_days),
            reports_age=dt.timedelta(days=self.retention_reports_days),
            baselines_age=dt.timedelta(days=self.retention_baselines_days),
        )

    def report_limits(self) -> ReportLimits:
        """The SDCReport caps these settings set."""
        return ReportLimits(
            window=dt.timedelta(seconds=self.report_window_seconds),
            per_job=self.report_per_job,
            max_nodes_per_job=self.report_max_nodes_per_job,
            per_namespace=self.report_per_namespace,
            node_window=dt.timedelta(seconds=self.report_node_window_seconds),
            per_cluster=self.report_per_cluster,
            pool_share=self.report_pool_share,
            refused_per_reporter=self.report_refused_per_reporter,
            refused_per_namespace=self.report_refused_per_namespace,
            refused_per_cluster=self.report_refused_per_cluster,
        )


def load_settings() -> Settings:
    """Read settings once; raises pydantic.ValidationError naming the bad variable."""
    return Settings()
