"""Operator settings from the environment (``SDCGUARD_*``), validated at start-up.

A wrong value stops the operator at once with pydantic's message naming the
variable, instead of surfacing as odd behaviour hours later.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from sdcguard.domain.reports import ReportLimits


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

    def report_limits(self) -> ReportLimits:
        """The SDCReport caps these settings set."""
        return ReportLimits(
            window=dt.timedelta(seconds=self.report_window_seconds),
            per_job=self.report_per_job,
            max_nodes_per_job=self.report_max_nodes_per_job,
            per_namespace=self.report_per_namespace,
            node_window=dt.timedelta(seconds=self.report_node_window_seconds),
        )


def load_settings() -> Settings:
    """Read settings once; raises pydantic.ValidationError naming the bad variable."""
    return Settings()
