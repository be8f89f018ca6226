"""Operator settings from the environment (``SDCGUARD_*``), validated at start-up.

A wrong value stops the operator at once with pydantic's message naming the
variable, instead of surfacing as odd behaviour hours later.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


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


def load_settings() -> Settings:
    """Read settings once; raises pydantic.ValidationError naming the bad variable."""
    return Settings()
