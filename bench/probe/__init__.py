"""Probe timing benchmark: ``python -m bench.probe.run``."""
