"""An operation-level watch on everything that leaves the device during a block of code.

The probe's checks send data to the host through one function,
:meth:`sdcprobe.backends.Backend.to_host`. :class:`HostGuard` wraps it to record
every crossing (what, how many bytes) and, with a ``TorchDispatchMode`` and a few
patched ``Tensor`` methods, catches every other way a tensor's contents could
reach Python: ``aten._local_scalar_dense`` (``item()``, ``float(t)``, ``bool(t)``:
each a host sync), device-to-host ``_to_copy``/``copy_`` (on accelerators),
``.cpu()``, ``.numpy()``, ``.tolist()`` and ``.to("cpu")`` on anything that did
not come back through ``to_host``. On the CPU backend the device *is* the host,
so these calls are the only sign of intent: that is what makes the check
meaningful there. A crossing larger than ``limit`` bytes, or any crossing
outside ``to_host``, is a violation that names the check, the tensor and the
call site.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sdcprobe.backends import Backend

#: Anything larger than this crossing in one piece is a tensor, not a summary.
LIMIT_BYTES = 4096


@dataclass
class Crossing:
    """One piece of data that reached the host."""

    what: str
    nbytes: int
    where: str


@dataclass
class HostGuard:
    """Records crossings for ``check``; ``violations`` says what broke the rules."""

    check: str
    limit: int = LIMIT_BYTES
    crossings: list[Crossing] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    scalar_reads: int = 0
    _host: set[int] = field(default_factory=set)
    _inside: int = 0

    @property
    def syncs(self) -> int:
        """Host syncs seen: every crossing waits for the device."""
        return len(self.crossings) + self.scalar_reads

    def _is_host(self, tensor: torch.Tensor) -> bool:
        return tensor.untyped_storage().data_ptr() in self._host

    def flag(self, how: str, tensor: torch.Tensor) -> None:
        """Record a crossing outside ``to_host``."""
        if self._inside or self._is_host(tensor):
            return
        self.violations.append(
            f"{self.check}: {how} on a {tuple(tensor.shape)} {tensor.dtype} device tensor "
            f"({tensor.numel() * tensor.element_size()} bytes) at {_caller()}, outside "
            "Backend.to_host"
        )

    def wrap_to_host(self, original: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        guard = self

        def to_host(backend: Backend, tensor: torch.Tensor, what: str = "") -> torch.Tensor:
            nbytes = tensor.numel() * tensor.element_size()
            guard.crossings.append(Crossing(what, nbytes, _caller()))
            if nbytes > guard.limit:
                guard.violations.append(
                    f"{guard.check}: {what or 'a tensor'} ({tuple(tensor.shape)} {tensor.dtype}, "
                    f"{nbytes} bytes) crossed to the host at {_caller()}; the limit is "
                    f"{guard.limit} bytes per crossing"
                )
            guard._inside += 1
            try:
                out = original(backend, tensor, what)
            finally:
                guard._inside -= 1
            guard._host.add(out.untyped_storage().data_ptr())
            return out

        return to_host


class _Watch(TorchDispatchMode):
    """Sees every aten op below autograd: scalar reads and device-to-host copies."""

    def __init__(self, guard: HostGuard) -> None:
        super().__init__()
        self.guard = guard

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        guard = self.guard
        if func is torch.ops.aten._local_scalar_dense.default and not guard._inside:
            tensor = args[0]
            if not guard._is_host(tensor):
                guard.scalar_reads += 1
                guard.flag("a scalar read (item/float/int/bool)", tensor)
        elif func is torch.ops.aten._to_copy.default and not guard._inside:
            src, device = args[0], kwargs.get("device")
            if (
                device is not None
                and torch.device(device).type == "cpu"
                and src.device.type != "cpu"
            ):
                guard.flag("a copy to the host", src)
        return func(*args, **kwargs)


def _caller() -> str:
    """The first frame outside torch and this module: the probe code that asked."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        name = frame.filename
        if "hostguard" in name or "/torch/" in name or "backends.py" in name:
            continue
        return f"{name.rsplit('/', 1)[-1]}:{frame.lineno} ({frame.name})"
    return "?"


@contextmanager
def host_guard(check: str, limit: int = LIMIT_BYTES) -> Iterator[HostGuard]:
    """Watch everything that leaves the device inside the block."""
    guard = HostGuard(check, limit)
    patched: dict[str, Any] = {}

    def patch(name: str, how: str) -> None:
        original = getattr(torch.Tensor, name)
        patched[name] = original

        def watched(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            guard.flag(how, self)
            return original(self, *args, **kwargs)

        setattr(torch.Tensor, name, watched)

    original_to = torch.Tensor.to

    def watched_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = kwargs.get("device", args[0] if args else None)
        if target == "cpu":  # what code that means "to the host" writes
            guard.flag('.to("cpu")', self)
        return original_to(self, *args, **kwargs)

    original_to_host = Backend.to_host
    for name, how in (("cpu", ".cpu()"), ("numpy", ".numpy()"), ("tolist", ".tolist()")):
        patch(name, how)
    torch.Tensor.to = watched_to  # type: ignore[method-assign]
    Backend.to_host = guard.wrap_to_host(original_to_host)  # type: ignore[method-assign]
    try:
        with _Watch(guard):
            yield guard
    finally:
        Backend.to_host = original_to_host  # type: ignore[method-assign]
        torch.Tensor.to = original_to  # type: ignore[method-assign]
        for name, original in patched.items():
            setattr(torch.Tensor, name, original)
