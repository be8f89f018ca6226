"""Kubernetes resource quantities (``8``, ``1k``, ``500m``, ``2Gi``, ``1e3``) as Nodes and
Pods state them, read by the grammar of apimachinery's ``resource.Quantity``.

domain/ imports no Kubernetes client, so the grammar lives here; a unit test holds it
to ``kubernetes.utils.parse_quantity`` over every form the grammar allows::

    <quantity>        ::= <signedNumber><suffix>
    <signedNumber>    ::= <number> | "+" <number> | "-" <number>
    <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
    <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
    <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei
    <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E
    <decimalExponent> ::= "e" <signedInteger> | "E" <signedInteger>

The Python client is laxer than the API server (it hands the number to ``Decimal``,
which also takes spaces, underscores, ``NaN`` and ``Infinity``); those are refused
here, as the API server refuses them.
"""

from __future__ import annotations

import re
from decimal import Decimal, DecimalException

_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<binary>[KMGTPE])i|(?P<exponent>[eE][+-]?[0-9]+)|(?P<decimal>[numkMGTPE]))?"
)
_DECIMAL_POWERS = {"n": -3, "u": -2, "m": -1, "k": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
"""Powers of 1000 of the decimal SI suffixes."""
_BINARY_POWERS = {"K": 1, "M": 2, "G": 3, "T": 4, "P": 5, "E": 6}
"""Powers of 1024 of the binary SI suffixes (``Ki`` ... ``Ei``)."""


def parse_quantity(value: object) -> Decimal:
    """The exact value of a quantity; raises ValueError, naming it, for anything the
    grammar does not allow. Whole numbers given as ``int`` are taken as they are."""
    if isinstance(value, int) and not isinstance(value, bool):
        return Decimal(value)
    if not isinstance(value, str) or (match := _QUANTITY.fullmatch(value)) is None:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. 8, 1k, 500m, 2Gi)")
    number = Decimal(match["number"])
    try:
        if match["binary"]:
            return number * (Decimal(1024) ** _BINARY_POWERS[match["binary"]])
        if match["exponent"]:
            return Decimal(value)  # exact, as Decimal reads "1.5e3"
        if match["decimal"]:
            return number * (Decimal(1000) ** _DECIMAL_POWERS[match["decimal"]])
    except DecimalException as exc:  # a result past Decimal's range
        raise ValueError(f"{value!r} is out of range") from exc
    return number


def whole_quantity(value: object) -> int:
    """An extended-resource count (``"8"``, ``"1k"``); anything that is not a whole
    number counts as 0.

    Extended resources (``nvidia.com/gpu``, ``aws.amazon.com/neuron``, ...) are whole
    numbers (the API server refuses fractions of them), so a fraction (``"500m"``) or
    garbage is no devices at all.
    """
    try:
        amount = parse_quantity(value)
    except ValueError:
        return 0
    return int(amount) if amount == amount.to_integral_value() else 0
