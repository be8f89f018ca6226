"""Exact digests of tensors, computed where the tensors live.

A digest is two 64-bit integers per tensor: the wrapping sum of the tensor's raw
words, and the wrapping sum of each word times an odd weight derived from its
position. Integer addition is associative, so the digest is the same whatever
order the device reduces in (no determinism flag needed for the digest itself),
and any single flipped bit changes the first sum (a flip of bit ``b`` adds
``±2^b``, times an odd weight for the second sum). The weighted sum also catches
two words that swap places.

Nothing is copied to the host: words are viewed as integers on the device and
summed there, in chunks so the temporary integer copies stay small. Only the
``[n, 2]`` int64 result is exchanged between ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

#: Position weights are ``2 * pos * _MULT + 1``: odd for every position, and a chunk's
#: weights are the first chunk's plus a constant, so they are computed once per device.
_MULT = 0x9E3779B97F4A7C15  # the golden ratio in 64 bits


def _wrap(value: int) -> int:
    """``value`` modulo 2^64 as a signed int64 (what tensor arithmetic wraps to)."""
    return ((value + (1 << 63)) % (1 << 64)) - (1 << 63)


_STEP = _wrap(2 * _MULT)
#: Words per chunk: bounds the temporary int64 copies (32 MiB each); the position
#: weights of one chunk are cached per device.
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


_BASE: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _to_int32(values: torch.Tensor) -> torch.Tensor:
    """int64 values modulo 2^32 as int32 (exact conversion of the wrapped value)."""
    return (((values + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)).to(torch.int32)


def _base_weights(device: torch.device, n: int, dtype: torch.dtype) -> torch.Tensor:
    """``2 * i * _MULT + 1`` for ``i < n`` in ``dtype``'s wrapping arithmetic (cached per
    device, grown as needed)."""
    key = (device, dtype)
    base = _BASE.get(key)
    if base is None or base.numel() < n:
        wide = torch.arange(max(n, 1024), dtype=torch.int64, device=device) * _STEP + 1
        base = wide if dtype == torch.int64 else _to_int32(wide)
        _BASE[key] = base
    return base[:n]


def tensor_digest(tensor: torch.Tensor, chunk: int = CHUNK) -> torch.Tensor:
    """``[2]`` int64 digest of ``tensor`` on its device: (sum of words, weighted sum).

    Words of 4 bytes or fewer are weighted in wrapping 32-bit arithmetic (an odd
    weight is invertible modulo 2^32, so a changed word always changes its product)
    and summed exactly in 64 bits, one chunk at a time.
    """
    words = _words(tensor)
    if words.element_size() < 4:
        words = words.to(torch.int32)
    n = words.numel()
    acc = torch.zeros(2, dtype=torch.int64, device=words.device)
    for start in range(0, n, chunk):
        w = words[start : start + chunk]
        weight = _base_weights(w.device, w.numel(), w.dtype)
        if start:
            offset = _wrap(start * _STEP)
            if w.dtype == torch.int32:
                offset = ((offset + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)
            weight = weight + offset
        # Widening first is much faster than sum(dtype=int64) on CPU kernels.
        acc[0] += w.to(torch.int64).sum()
        acc[1] += (w * weight).to(torch.int64).sum()
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
