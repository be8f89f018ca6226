"""A small PromQL evaluator for the expression forms the chart's alerts use, so a test
can tell whether an alert would fire on the operator's real /metrics scrapes.

No Prometheus runs in the tests. This evaluates instant queries over a short history
of scrapes (oldest first): a selector reads the newest scrape, and ``increase(m[w])``
is the counter's rise from the oldest to the newest scrape (the window ``w`` is taken
to cover them all; a series missing from the oldest counts from 0, a drop is a reset).

Supported: selectors with ``=``, ``!=``, ``=~``, ``!~`` matchers; ``sum``/``max``/
``min``/``count`` with ``by (...)``; ``increase``, ``clamp_min``, ``vector``; ``+ - * /``
and the comparisons ``> < >= <= == !=`` (as filters) between vectors and scalars;
``and``, ``unless``, ``or``.
Anything else raises :class:`PromQLError`, so an alert written in a form this does not
know fails its test loudly instead of passing unread.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]
Scrape = Mapping[tuple[str, Labels], float]
"""One /metrics scrape: (sample name, labels) -> value."""


class PromQLError(ValueError):
    pass


_TOKEN = re.compile(
    r"""\s*(?:
    (?P<duration>\d+(?:ms|[smhdwy])(?![a-zA-Z0-9_]))
  | (?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*")
  | (?P<op>=~|!~|==|!=|>=|<=|[-+*/><=(){}\[\],])
  | (?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)
  )""",
    re.VERBOSE,
)

_AGGREGATIONS: dict[str, Callable[[list[float]], float]] = {
    "sum": sum,
    "max": max,
    "min": min,
    "count": lambda values: float(len(values)),
}
_ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": lambda a, b: a / b if b else float("inf") if a > 0 else float("nan"),
}
_COMPARISONS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
    "==": operator.eq,
    "!=": operator.ne,
}


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise PromQLError(f"cannot read {text[pos : pos + 20]!r} in {text!r}")
        out.append(match.group().strip())
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


@dataclass
class _Parser:
    tokens: list[str]
    history: Sequence[Scrape]
    pos: int = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise PromQLError(f"expected {expected or 'more'} at token {self.pos}, got {token!r}")
        self.pos += 1
        return token

    # Precedence, lowest first: or; and, unless; comparisons; + -; * /.
    def expr(self) -> Vector | float:
        left = self.intersection()
        while self.peek() == "or":
            self.take()
            right = self.intersection()
            if not isinstance(left, dict) or not isinstance(right, dict):
                raise PromQLError("'or' needs two vectors")
            # The right side's series whose label sets the left side lacks.
            left = {**right, **left}
        return left

    def intersection(self) -> Vector | float:
        left = self.comparison()
        while self.peek() in ("and", "unless"):
            keep = self.take() == "and"
            right = self.comparison()
            if not isinstance(left, dict) or not isinstance(right, dict):
                raise PromQLError("'and' and 'unless' need two vectors")
            # Matched on the whole label set (the chart's alerts aggregate both sides
            # by the same labels first).
            left = {k: v for k, v in left.items() if (k in right) == keep}
        return left

    def comparison(self) -> Vector | float:
        left = self.additive()
        while self.peek() in _COMPARISONS:
            op = _COMPARISONS[self.take()]
            left = _filter(left, self.additive(), op)
        return left

    def additive(self) -> Vector | float:
        left = self.multiplicative()
        while self.peek() in ("+", "-"):
            op = _ARITHMETIC[self.take()]
            left = _binary(left, self.multiplicative(), op)
        return left

    def multiplicative(self) -> Vector | float:
        left = self.primary()
        while self.peek() in ("*", "/"):
            op = _ARITHMETIC[self.take()]
            left = _binary(left, self.primary(), op)
        return left

    def primary(self) -> Vector | float:
        token = self.take()
        if token == "(":
            inner = self.expr()
            self.take(")")
            return inner
        if re.fullmatch(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", token):
            return float(token)
        if token in _AGGREGATIONS:
            return self.aggregation(_AGGREGATIONS[token])
        if token == "increase":
            self.take("(")
            name, matchers = self.selector(self.take())
            self.take("[")
            self.take()  # the window: the history is taken to lie within it
            self.take("]")
            self.take(")")
            return _increase(self.history, name, matchers)
        if token == "vector":
            self.take("(")
            scalar = self.expr()
            self.take(")")
            if not isinstance(scalar, float):
                raise PromQLError("vector(scalar)")
            return {frozenset(): scalar}
        if token == "clamp_min":
            self.take("(")
            vector = self.expr()
            self.take(",")
            floor = self.expr()
            self.take(")")
            if not isinstance(vector, dict) or not isinstance(floor, float):
                raise PromQLError("clamp_min(vector, scalar)")
            return {k: max(v, floor) for k, v in vector.items()}
        if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", token) and self.peek() != "(":
            name, matchers = self.selector(token)
            if self.peek() == "[":
                raise PromQLError(f"a range vector of {name} outside increase()")
            return _select(self.history[-1], name, matchers)
        raise PromQLError(f"unsupported at {token!r}")

    def labels_list(self) -> list[str]:
        self.take("(")
        names: list[str] = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take()
        self.take(")")
        return names

    def aggregation(self, fold: Callable[[list[float]], float]) -> Vector:
        by: list[str] = []
        if self.peek() == "by":
            self.take()
            by = self.labels_list()
        self.take("(")
        inner = self.expr()
        self.take(")")
        if self.peek() == "by":
            self.take()
            by = self.labels_list()
        if not isinstance(inner, dict):
            raise PromQLError("aggregation over a scalar")
        groups: dict[Labels, list[float]] = {}
        for labels, value in inner.items():
            key = frozenset((k, v) for k, v in labels if k in by)
            groups.setdefault(key, []).append(value)
        return {k: fold(v) for k, v in groups.items()}

    def selector(self, name: str) -> tuple[str, list[tuple[str, str, str]]]:
        matchers: list[tuple[str, str, str]] = []
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                label = self.take()
                op = self.take()
                if op not in ("=", "!=", "=~", "!~"):
                    raise PromQLError(f"matcher {op!r}")
                value = self.take()
                if not value.startswith('"'):
                    raise PromQLError(f"label value {value!r} not quoted")
                matchers.append((label, op, value[1:-1]))
                if self.peek() == ",":
                    self.take()
            self.take("}")
        return name, matchers


def _matches(labels: Labels, matchers: list[tuple[str, str, str]]) -> bool:
    have = dict(labels)
    for label, op, want in matchers:
        value = have.get(label, "")
        if op == "=" and value != want:
            return False
        if op == "!=" and value == want:
            return False
        if op == "=~" and not re.fullmatch(want, value):
            return False
        if op == "!~" and re.fullmatch(want, value):
            return False
    return True


def _select(scrape: Scrape, name: str, matchers: list[tuple[str, str, str]]) -> Vector:
    return {
        labels: value
        for (sample, labels), value in scrape.items()
        if sample == name and _matches(labels, matchers)
    }


def _increase(history: Sequence[Scrape], name: str, matchers: list[tuple[str, str, str]]) -> Vector:
    series = [_select(s, name, matchers) for s in history]
    out: Vector = {}
    for labels in series[-1]:
        rise = 0.0
        last = series[0].get(labels, 0.0)  # a series new in the window counts from 0
        for scrape in series[1:]:
            if labels not in scrape:
                continue
            value = scrape[labels]
            rise += value - last if value >= last else value  # a drop is a counter reset
            last = value
        out[labels] = rise
    return out


def _binary(
    left: Vector | float, right: Vector | float, op: Callable[[float, float], float]
) -> Vector | float:
    if isinstance(left, float) and isinstance(right, float):
        return op(left, right)
    if isinstance(left, float):
        assert isinstance(right, dict)
        return {k: op(left, v) for k, v in right.items()}
    if isinstance(right, float):
        return {k: op(v, right) for k, v in left.items()}
    return {k: op(v, right[k]) for k, v in left.items() if k in right}


def _filter(
    left: Vector | float, right: Vector | float, op: Callable[[float, float], bool]
) -> Vector | float:
    if isinstance(left, dict) and isinstance(right, float):
        return {k: v for k, v in left.items() if op(v, right)}
    if isinstance(left, dict) and isinstance(right, dict):
        return {k: v for k, v in left.items() if k in right and op(v, right[k])}
    raise PromQLError("a comparison needs a vector on its left")


def evaluate(expr: str, history: Sequence[Scrape]) -> Vector:
    """The instant vector ``expr`` gives over ``history`` (oldest scrape first); for an
    alert expression, the series that would fire (empty: the alert stays quiet)."""
    if not history:
        raise PromQLError("no scrapes")
    parser = _Parser(_tokens(expr), history)
    value = parser.expr()
    if parser.peek() is not None:
        raise PromQLError(f"unread from token {parser.pos}: {parser.tokens[parser.pos :]}")
    if not isinstance(value, dict):
        raise PromQLError("an alert expression must give a vector")
    return value


def parse_scrape(text: str) -> dict[tuple[str, Labels], float]:
    """A /metrics text exposition as a scrape."""
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def firing(expr: str, history: Sequence[Scrape]) -> list[dict[str, str]]:
    """The label sets of the series ``expr`` fires for, sorted."""
    return sorted((dict(k) for k in evaluate(expr, history)), key=lambda d: sorted(d.items()))
