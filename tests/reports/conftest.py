"""The operator tests' fixtures (one operator process per module, the session's CRDs)."""

from tests.operator.conftest import (  # noqa: F401  (fixtures and the report hook)
    _show_operator_log,
    crds,
    operator,
    pytest_runtest_makereport,
)
