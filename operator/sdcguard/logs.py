"""structlog configuration: JSON in clusters, a readable console format locally."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each record to ``sys.stderr`` as it is when the record is written, not as
    it was when logging was configured: a thread that outlives a redirected stderr (a
    test's capture, a tool that swaps it) writes to the live one, never to a closed
    file."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        """Ignored: the stream is always the current ``sys.stderr``."""


class HealthChecksAtDebug(logging.Filter):
    """aiohttp's access log, whose only server here is Kopf's liveness endpoint, writes
    every ``/healthz`` probe (one every few seconds) at INFO, burying what the operator
    did. Its records become DEBUG records: shown only when the log level is debug."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and record.levelno < logging.WARNING:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger().isEnabledFor(record.levelno)


ACCESS_LOGGER = "aiohttp.access"


def configure_logging(fmt: str = "json", level: str = "info") -> None:
    """Route structlog (and stdlib logging, e.g. kopf's) to one stream and format."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if fmt == "json":
        shared.append(
            structlog.processors.ExceptionRenderer(
                structlog.tracebacks.ExceptionDictTransformer(show_locals=False)
            )
        )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                renderer,
            ],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # kopf logs every handler invocation at INFO; keep its noise at WARNING.
    logging.getLogger("kopf").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    logging.getLogger("urllib3").setLevel(logging.WARNING)
    access = logging.getLogger(ACCESS_LOGGER)
    access.filters[:] = [f for f in access.filters if not isinstance(f, HealthChecksAtDebug)]
    access.addFilter(HealthChecksAtDebug())
