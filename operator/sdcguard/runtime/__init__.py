"""The operator's controller runtime: the fleet's copy kept by list-then-watch
(``mirror``), one active replica by a Lease (``leader``, ``terms``), the heap of a
long-lived copy (``heap``) and the scheduling of reconcile passes (``scheduling``).

It knows nothing of what the operator decides: it imports neither the domain nor the
adapters (an import-linter contract), and the domain never imports it. What it
guarantees, and the tests that hold it to that, are in this package's README.md.
"""
