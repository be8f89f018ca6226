"""sdcdev: the tools that develop and demonstrate sdcguard, run from a checkout.

Not shipped: no wheel holds it and the operator image leaves it out. It holds the
simulated fleet and the demo (:mod:`sdcdev.sim`), the local control plane and real
node (:mod:`sdcdev.cluster`), the operator harness that tests and benchmarks share
(:mod:`sdcdev.harness`) and the fault-injecting API proxy (:mod:`sdcdev.faultproxy`).
It sits beside ``sdcguard`` in the ``operator/`` source root so the checkout's
``PYTHONPATH`` (``operator:jobs:.``) reaches it with nothing more; import-linter keeps
the operator from importing it, and it imports nothing from ``tests``.

Its tools use the checkout's other parts by path (the chart, the CRDs, the scripts that
build binaries and images), all found from :data:`REPO`.
"""

from pathlib import Path

#: The checkout this package runs from (``operator/sdcdev`` is two levels down).
REPO = Path(__file__).resolve().parents[2]
