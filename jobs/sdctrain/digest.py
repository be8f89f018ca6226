"""Exact digests of tensors, computed where the tensors live.

A digest is two 64-bit integers per tensor: the wrapping sum of the tensor's raw
words, and the wrapping sum of each word times an odd weight derived from its
position. Integer addition is associative, so the digest is the same whatever
order the device reduces in (no determinism flag needed for the digest itself),
and any single flipped bit changes the first sum (a flip of bit ``b`` adds
``±2^b``, times an odd weight for the second sum). The weighted sum also catches
two words that swap places.

Nothing is copied to the host: words are viewed as integers on the device and
summed there, in chunks so the temporary integer copy stays small. Only the
``[n, 2]`` int64 result is exchanged between ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Golden-ratio multiplier (as a signed int64) and an odd offset for the position weights.
_MULT = -7046029254386353131  # 0x9E3779B97F4A7C15
_OFFSET = 0x2545F4914F6CDD1D
#: Words per chunk: bounds the temporary int64 copy (32 MiB of words, 64 MiB of weights).
CHUNK = 1 << 22

_WORD_VIEW: dict[int, torch.dtype] = {
    1: torch.uint8,
    2: torch.int16,
    4: torch.int32,
    8: torch.int64,
}


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat integer view on its own device (no host copy)."""
    t = tensor.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if t.is_complex():
        t = torch.view_as_real(t)
    if not t.is_contiguous():
        t = t.contiguous()
    flat = t.reshape(-1)
    view = _WORD_VIEW.get(flat.element_size())
    if view is None:
        raise TypeError(f"cannot digest a tensor of dtype {tensor.dtype}")
    return flat.view(view)


def tensor_digest(tensor: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """``[2]`` int64 digest of ``tensor`` on its device: (sum of words, weighted sum)."""
    words = _words(tensor)
    n = words.numel()
    acc = torch.zeros(2, dtype=torch.int64, device=words.device)
    for start in range(0, n, chunk):
        w = words[start : start + chunk].to(torch.int64)
        pos = torch.arange(start, start + w.numel(), dtype=torch.int64, device=w.device)
        weight = pos * _MULT + _OFFSET
        weight = weight | 1
        acc[0] += w.sum()
        acc[1] += (w * weight).sum()
    # Shape and dtype are part of what replicas must agree on.
    acc[1] += n * 31 + len(str(tensor.dtype))
    return acc


def digest_all(tensors: Sequence[torch.Tensor], device: torch.device | None = None) -> torch.Tensor:
    """``[len(tensors), 2]`` int64 digests, on ``device`` (the first tensor's by default)."""
    if not tensors:
        return torch.zeros((0, 2), dtype=torch.int64, device=device or "cpu")
    target = device or tensors[0].device
    return torch.stack([tensor_digest(t).to(target) for t in tensors])


def differing_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Indices of the rows where two ``[n, 2]`` digest tables differ (host ints)."""
    if a.shape != b.shape:
        raise ValueError(f"digest tables of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    diff = (a != b).any(dim=1)
    return [int(i) for i in diff.nonzero().reshape(-1).tolist()]
