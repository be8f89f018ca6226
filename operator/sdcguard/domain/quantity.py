"""Counts of extended resources (accelerators) as Nodes and Pods state them."""

from __future__ import annotations


def whole_quantity(value: object) -> int:
    """An extended-resource count: a whole number (``"8"``); anything else counts as 0.

    Extended resources (``nvidia.com/gpu``, ``aws.amazon.com/neuron``, ...) are whole
    numbers, so a fraction, a suffix (``"1k"``) or garbage is no devices at all.
    """
    try:
        return int(str(value))
    except ValueError:
        return 0
