"""sdcprobe: screens a node's accelerators for silent data corruption.

Run ``python -m sdcprobe run``; see README.md in this directory. This package
root, like :mod:`sdcprobe.result`, imports neither torch nor numpy so the
operator can read probe results without the probe's dependencies.
"""

__version__ = "0.1.0"
