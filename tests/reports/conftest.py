"""The operator tests' fixtures (one operator process per module, the session's CRDs),
and a wait for the SDCReport CRD."""

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sdcdev.harness import GROUP, VERSION, wait_for
from tests.operator.conftest import (  # noqa: F401  (fixtures and the report hook)
    _show_operator_log,
    operator,
    pytest_runtest_makereport,
)


@pytest.fixture
def served(api_client: client.ApiClient, request: pytest.FixtureRequest) -> None:
    """Waits until the API server serves SDCReports (the session applies every CRD)."""
    request.getfixturevalue("crds")
    custom = client.CustomObjectsApi(api_client)

    def ok() -> bool:
        try:
            custom.list_cluster_custom_object(GROUP, VERSION, "sdcreports", limit=1)
        except ApiException:
            return False
        return True

    wait_for(ok, 30, "the SDCReport CRD to be served")
