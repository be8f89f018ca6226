"""Operands made and outputs digested where they live: on the device.

Every check draws its inputs from seeds with a generator *on the device*
(:func:`device_generator`), so no operand crosses from the host, and every
device of a node (same model, same software) draws the same numbers. Outputs
are reduced on the device to an exact integer digest (:func:`word_digest`), so
a round sends the host a few bytes, not its tensors.

The digest views a tensor's raw bits as 32-bit words (16-bit types two to a word
where they pair up, one to a word otherwise), mixes each word with a key derived
from its position (xor, then a multiply-xorshift-multiply bijection on 32 bits,
as in MurmurHash3's finaliser, in wrapping int32 arithmetic) and sums the mixed
words in 64-bit integers. Integer addition is associative, so the digest is the
same whatever order the device reduces in, and the sum cannot overflow: each
mixed word is below 2^31 in magnitude and a tensor holds far fewer than 2^32
words. Any single changed word always changes the digest (the mix is a
bijection); several changed words collide only if their mixed differences sum to
exactly zero, about one chance in 2^32 for unrelated changes. Unlike a plain or
position-weighted sum of the words, bit flips of opposite sign in two words do
not cancel.
"""

from __future__ import annotations

import hashlib

import torch

_MASK32 = 0xFFFFFFFF
# Odd 32-bit constants (as signed int32): multiplying by one is a bijection on 32-bit
# words in wrapping arithmetic.
_POSITION_KEY = 0x2545F491
_MIX_1 = 0x45D9F3B
_MIX_2 = -0x61C8864F  # 0x9E3779B1 as int32

#: Cached position keys per (device, words): the compute check digests the same
#: shapes every round. Bounded: a run digests a handful of distinct sizes.
_KEYS: dict[tuple[str, int], torch.Tensor] = {}
_KEYS_LIMIT = 64


def _position_keys(device: torch.device, n: int) -> torch.Tensor:
    key = (str(device), n)
    keys = _KEYS.get(key)
    if keys is None:
        if len(_KEYS) >= _KEYS_LIMIT:
            _KEYS.clear()
        wide = (torch.arange(n, dtype=torch.int64, device=device) * _POSITION_KEY) & _MASK32
        keys = _KEYS[key] = torch.where(wide >= 1 << 31, wide - (1 << 32), wide).to(torch.int32)
    return keys


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's raw bits as flat int32 words, on the tensor's device: a view of
    4- and 8-byte types, and of 2-byte types two to a word where they pair up (not
    to be written to); otherwise 2-byte types and bytes widened one to a word."""
    t = tensor.detach()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    t = t.contiguous().reshape(-1)
    size = t.element_size()
    if size >= 4 or (size == 2 and t.numel() % 2 == 0):
        return t.view(torch.int32)
    if size == 2:
        return t.view(torch.int16).to(torch.int32)
    return t.view(torch.uint8).to(torch.int32)


def word_digest(tensor: torch.Tensor) -> torch.Tensor:
    """A ``[1]`` int64 tensor on ``tensor``'s device: the sum over its 32-bit words of
    ``mix(word XOR position key)``. Exact and independent of reduction order.

    The mix runs in wrapping 32-bit integer arithmetic, as every torch backend
    computes int32 products (two's complement), which keeps it to a few passes over
    4-byte words: multiply by an odd constant, xor with the word shifted right by 16
    (logically: the shifted-in bits are masked to zero), multiply again. Each step
    is a bijection on 32-bit words, and the sum of the mixed words, in int64, is
    exact (each is below 2^31 in magnitude)."""
    if tensor.device.type == "xla":
        # torch-xla has no bit-reinterpreting views: its tensors are digested on the host
        # (XLA materialises lazy tensors for the read anyway) and the digest goes back.
        return word_digest(tensor.detach().to("cpu")).to(tensor.device)
    h = _words(tensor)
    # The first step writes a new tensor: the words themselves are left alone.
    h = torch.bitwise_xor(h, _position_keys(h.device, h.numel()))
    h.mul_(_MIX_1)
    h.bitwise_xor_((h >> 16).bitwise_and_(0xFFFF))
    h.mul_(_MIX_2)
    return h.sum(dtype=torch.int64).reshape(1)


def digest_hex(value: int, tensor_kind: str) -> str:
    """The host's name for a device digest: sha256 over the tensor's dtype and shape
    (``tensor_kind``) and the integer, so equal sums of different shapes differ."""
    return hashlib.sha256(f"{tensor_kind}:{value}".encode()).hexdigest()


def tensor_kind(tensor: torch.Tensor) -> str:
    """``dtype:shape``, what a digest is qualified by (host metadata, no device access)."""
    return f"{tensor.dtype}:{tuple(tensor.shape)}"


def device_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``: draws happen on the device.

    Devices of one model and software stack draw the same numbers from the same seed
    (the fingerprint pins both). Where the runtime has no device generator (XLA), the
    host's generator is returned and the caller moves what it draws (host to device
    only; nothing comes back)."""
    try:
        return torch.Generator(device=device).manual_seed(seed)
    except RuntimeError:
        return torch.Generator().manual_seed(seed)


def draw_normal(
    shape: tuple[int, ...], gen: torch.Generator, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """Standard normal values of ``dtype`` on ``device``, drawn from ``gen``. Normal, not
    uniform: a uniform draw's fixed granularity leaves the low mantissa bits of most
    values zero, and defects triggered by operand bits need them to vary."""
    out = torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32)
    return out.to(device=device, dtype=dtype)


def draw_integers(
    shape: tuple[int, ...], low: int, high: int, gen: torch.Generator, device: torch.device
) -> torch.Tensor:
    """Integers in [low, high) as int64 on ``device``, drawn from ``gen``."""
    out = torch.randint(low, high, shape, generator=gen, device=gen.device, dtype=torch.int64)
    return out.to(device)


def seed_of(*parts: int) -> int:
    """A 63-bit seed from integers (round, dtype, rank...): distinct inputs give
    unrelated streams."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1
