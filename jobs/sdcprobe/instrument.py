"""Hook points shared by every check: fault injection, submodule digests, ABFT.

Checks and the golden model route every GEMM and every interesting output
through one :class:`Instrumentation`. With nothing enabled a hook is a plain
``a @ b``; with an injector it corrupts outputs (on the device); with ``record``
it keeps the outputs for per-step digests, taken on the device and read back
together once per step; with ``abft`` it computes checksum residuals of every
GEMM *after* injection (what a checksummed GEMM would have seen).
"""

from __future__ import annotations

import torch

from sdcprobe.abft import GemmResidual, abft_residual
from sdcprobe.backends import Backend
from sdcprobe.devicedata import digest_hex, tensor_kind, word_digest
from sdcprobe.faults import Injector


def tensor_digest(tensor: torch.Tensor, backend: Backend | None = None) -> str:
    """Digest of one tensor (its device digest, read back at once; checks batch theirs)."""
    value = word_digest(tensor)
    host = backend.to_host(value, "digest") if backend is not None else value.to("cpu")
    return digest_hex(int(host.tolist()[0]), tensor_kind(tensor))


class Instrumentation:
    """The hooks of one device worker (or one benchmark trial)."""

    def __init__(
        self,
        backend: Backend,
        injector: Injector | None = None,
        record: bool = False,
        abft: bool = False,
    ) -> None:
        self.backend = backend
        self.injector = injector if injector is not None and injector.enabled else None
        self.record_outputs = record
        self.abft_enabled = abft
        self.step = 0
        self.records: dict[str, torch.Tensor] = {}
        self.residuals: list[GemmResidual] = []

    def set_step(self, step: int) -> None:
        """Enter a new step: faults draw whether they are active, records restart."""
        self.step = step
        self.records = {}
        if self.injector is not None:
            self.injector.set_step(step)

    def matmul(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        label: str,
        name: str | None = None,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``a @ b`` through the hooks; ``label`` is the site (``matmul`` always applies).
        ``out``: a buffer to write the product into (a fault may still return a new one)."""
        product = a @ b if out is None else torch.matmul(a, b, out=out)
        if self.injector is not None:
            labels = (label,) if label == "matmul" else (label, "matmul")
            if self.injector.wants(labels):
                clean = product
                product = self.injector.corrupt(
                    clean, labels, operand=lambda: _aligned_operand(a, clean)
                )
        if self.abft_enabled:
            self.residuals.append(abft_residual(a, b, product, label=name or label, step=self.step))
        if name is not None:
            self.record(name, product)
        return product

    def linear(
        self, x: torch.Tensor, weight: torch.Tensor, label: str, name: str | None = None
    ) -> torch.Tensor:
        """``x @ weightᵀ`` (a GEMM hook)."""
        return self.matmul(x, weight.t(), label, name)

    def output(
        self,
        out: torch.Tensor,
        label: str,
        name: str | None = None,
        operand: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hook a non-GEMM output (norm, softmax, activation, embedding, all-reduce)."""
        if self.injector is not None:
            out = self.injector.corrupt(out, (label,), operand=operand)
        if name is not None:
            self.record(name, out)
        return out

    def corrupt_in_place(self, tensor: torch.Tensor, label: str) -> None:
        """Hook a tensor outside autograd (gradients, updates, parameters)."""
        if self.injector is not None:
            self.injector.corrupt_in_place(tensor, (label,))

    def corrupt_words(self, words: torch.Tensor, label: str = "memory") -> int:
        """Hook a buffer of int32 words at rest (flips in place); returns words changed."""
        if self.injector is None:
            return 0
        return self.injector.corrupt_words(words, (label,))

    def record(self, name: str, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` for this step's digests (hashed after the step's sync)."""
        if self.record_outputs:
            self.records[name] = tensor.detach()

    def digests(self, chars: int = 16) -> dict[str, str]:
        """Digests of everything recorded this step, in recording order (forward order):
        taken on the device and read back as one small table (one host transfer)."""
        if not self.records:
            return {}
        table = torch.cat([word_digest(t) for t in self.records.values()])
        values = self.backend.to_host(table, what=f"step {self.step} digests").tolist()
        return {
            name: digest_hex(value, tensor_kind(t))[:chars]
            for (name, t), value in zip(self.records.items(), values, strict=True)
        }


def _aligned_operand(a: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The input element that "belongs" to each output element, for ``operand_mask``.

    For ``out[..., i, j] = Σ_l a[..., i, l]·b[..., l, j]`` we take ``a[..., i, j mod k]``:
    a data-dependent trigger that is deterministic for given inputs.
    """
    k, n = a.shape[-1], out.shape[-1]
    cols = torch.arange(n, device=a.device) % k
    return a.detach().index_select(-1, cols)
