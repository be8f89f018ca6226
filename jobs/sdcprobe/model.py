"""A tiny decoder-only transformer, written out op by op so every op is hookable.

Attention with a causal mask, SwiGLU FFN, RMSNorm (pre-norm), untied LM head,
and a hand-written AdamW (so the update itself can be observed and corrupted).
Parameters are initialised on the host from a seed and then moved to the device,
so every backend starts from the same bits. No dropout, no randomness after
initialisation: a healthy device computes the same bits every time.
"""

from __future__ import annotations

import math

import torch

from sdcprobe.config import GoldenConfig
from sdcprobe.instrument import Instrumentation


def init_params(cfg: GoldenConfig, device: torch.device) -> dict[str, torch.Tensor]:
    """Parameters in a fixed order, drawn on the host from ``cfg.seed``."""
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + 17)
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab
    std = 0.02
    # Residual-branch outputs are scaled down with depth (GPT-2 style), so the
    # run is stable for any number of layers.
    out_std = std / math.sqrt(2 * cfg.n_layers)

    def normal(*shape: int, s: float = std) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * s

    params: dict[str, torch.Tensor] = {"embedding": normal(v, d)}
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        params[p + "norm1"] = torch.ones(d)
        params[p + "attention.qkv"] = normal(3 * d, d)
        params[p + "attention.output"] = normal(d, d, s=out_std)
        params[p + "norm2"] = torch.ones(d)
        params[p + "ffn.up"] = normal(2 * f, d)  # gate and up, fused
        params[p + "ffn.down"] = normal(d, f, s=out_std)
    params["final_norm"] = torch.ones(d)
    params["lm_head"] = normal(v, d)
    return {k: t.to(device).requires_grad_(True) for k, t in params.items()}


def synthetic_batch(cfg: GoldenConfig, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host tokens and targets for ``step`` from a seeded Markov chain.

    Each token is followed by its successor under a fixed random permutation
    with probability 0.9 (else a uniform random token), so the loss falls
    visibly within a few dozen steps: the run exercises a model that is
    learning, not one stuck at chance.
    """
    seed = cfg.step_seed(step)  # the screening's own seed after the baseline's steps
    successor = torch.randperm(cfg.vocab, generator=torch.Generator().manual_seed(seed + 99))
    gen = torch.Generator().manual_seed(seed * 7_919 + step * 104_729 + 1)
    n = cfg.seq_len + 1
    noise = torch.randint(0, cfg.vocab, (cfg.batch, n), generator=gen)
    follow = torch.rand(cfg.batch, n, generator=gen) < 0.9
    seq = torch.empty(cfg.batch, n, dtype=torch.int64)
    seq[:, 0] = noise[:, 0]
    for t in range(1, n):
        seq[:, t] = torch.where(follow[:, t], successor[seq[:, t - 1]], noise[:, t])
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm: ``x / rms(x) * weight``."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def forward(
    params: dict[str, torch.Tensor], tokens: torch.Tensor, cfg: GoldenConfig, ins: Instrumentation
) -> torch.Tensor:
    """Logits ``[batch, seq, vocab]``; every submodule output passes a hook."""
    b, t = tokens.shape
    d, h = cfg.d_model, cfg.n_heads
    hd = d // h
    emb = params["embedding"][tokens]
    x = ins.output(emb, "embedding", name="embedding")
    causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).triu(1)
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        hn = ins.output(rms_norm(x, params[p + "norm1"]), "norm", name=p + "norm1", operand=x)
        qkv = ins.linear(hn, params[p + "attention.qkv"], "attention.qkv", name=p + "attention.qkv")
        q, k, v = qkv.view(b, t, 3, h, hd).permute(2, 0, 3, 1, 4).unbind(0)
        q = q * (1.0 / math.sqrt(hd))  # scale before the GEMM: the hook sees the real scores
        scores = ins.matmul(q, k.transpose(-1, -2), "attention.scores", name=p + "attention.scores")
        scores = scores.masked_fill(causal, float("-inf"))
        probs = ins.output(
            torch.softmax(scores, dim=-1),
            "attention.softmax",
            name=p + "attention.softmax",
            operand=scores,
        )
        ctx = ins.matmul(probs, v, "attention.context", name=p + "attention.context")
        ctx = ctx.transpose(1, 2).reshape(b, t, d)
        attn = ins.linear(
            ctx, params[p + "attention.output"], "attention.output", name=p + "attention.output"
        )
        x = x + attn
        hn = ins.output(rms_norm(x, params[p + "norm2"]), "norm", name=p + "norm2", operand=x)
        up = ins.linear(hn, params[p + "ffn.up"], "ffn.up", name=p + "ffn.up")
        gate, lin = up.chunk(2, dim=-1)
        act = ins.output(
            torch.nn.functional.silu(gate) * lin,
            "activation",
            name=p + "ffn.activation",
            operand=gate,
        )
        down = ins.linear(act, params[p + "ffn.down"], "ffn.down", name=p + "ffn.down")
        x = x + down
    xn = ins.output(rms_norm(x, params["final_norm"]), "norm", name="final_norm", operand=x)
    return ins.linear(xn, params["lm_head"], "lm_head", name="lm_head")


class AdamW:
    """Decoupled-weight-decay Adam, elementwise and explicit (hookable, deterministic).

    Norm gains are not decayed (the usual practice). The update is computed in
    full, offered to the ``optimizer`` hook, then subtracted.
    """

    def __init__(self, params: dict[str, torch.Tensor], cfg: GoldenConfig) -> None:
        self.params = params
        self.cfg = cfg
        self.exp_avg = {k: torch.zeros_like(p) for k, p in params.items()}
        self.exp_avg_sq = {k: torch.zeros_like(p) for k, p in params.items()}
        self.t = 0

    @torch.no_grad()
    def step(self, ins: Instrumentation) -> None:
        """One update of every parameter from its ``.grad``."""
        cfg = self.cfg
        self.t += 1
        bc1 = 1.0 - cfg.beta1**self.t
        bc2 = 1.0 - cfg.beta2**self.t
        for name, p in self.params.items():
            g = p.grad
            assert g is not None, f"no gradient for {name}"
            m = self.exp_avg[name].mul_(cfg.beta1).add_(g, alpha=1.0 - cfg.beta1)
            v = self.exp_avg_sq[name].mul_(cfg.beta2).addcmul_(g, g, value=1.0 - cfg.beta2)
            update = (m / bc1) / ((v / bc2).sqrt() + cfg.eps)
            if "norm" not in name:
                update = update + cfg.weight_decay * p
            update = update * cfg.lr
            ins.corrupt_in_place(update, "optimizer")
            ins.record(f"optimizer.{name}", update)
            p.sub_(update)
