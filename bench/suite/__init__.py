"""The test suite's own figures: its slowest tests (``python -m bench.suite.slowest``)."""
