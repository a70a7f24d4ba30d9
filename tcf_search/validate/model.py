"""A Llama-style decoder in plain PyTorch, shaped by a ``costmodel.specs.ModelSpec``.

RMSNorm, rotary position embeddings, grouped-query attention through
``scaled_dot_product_attention`` (causal), and a SwiGLU (or GELU) MLP — the architecture of
Touvron et al. (2023) that ``costmodel.params`` counts. Its parameter count equals
``costmodel.params.total_params`` exactly, so memory measured on it can be held against the model.

Layers live in a ``ModuleDict`` keyed by their global index, and the embedding, final norm and
output head may be ``None``: a pipeline stage is this module with the other stages' parts deleted,
and its parameter names stay those of the whole model (the torchtitan convention).
"""

from __future__ import annotations

import math
import zlib
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from costmodel.specs import ModelSpec, Recompute

ROPE_THETA = 500_000.0  # Llama 3


def rope_tables(seq_len: int, head_dim: int, theta: float = ROPE_THETA,
                device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq_len, head_dim): channel i and i + head_dim/2 rotate together
    at frequency theta^(-2i/head_dim) (Su et al., 2021, in the half-split layout of HF Llama)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (batch, seq, heads, head_dim) by position: x*cos + rotate_half(x)*sin."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    c, s = cos[None, :, None, :].to(x.dtype), sin[None, :, None, :].to(x.dtype)
    return x * c + rotated * s


class Attention(nn.Module):
    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.head_dim = m.d_head
        self.rep = m.heads // m.kv_heads
        self.wq = nn.Linear(m.hidden, m.heads * m.d_head, bias=False)
        self.wk = nn.Linear(m.hidden, m.kv_heads * m.d_head, bias=False)
        self.wv = nn.Linear(m.hidden, m.kv_heads * m.d_head, bias=False)
        self.wo = nn.Linear(m.heads * m.d_head, m.hidden, bias=False)
        # context parallel: this rank holds sequence chunk ``cp_rank`` of ``cp_size``
        self.cp_group: object | None = None
        self.cp_rank, self.cp_size = 0, 1

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads/tp of them.
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        mask = None
        if self.cp_size > 1:
            # all-gather K and V along the sequence (Llama 3's context parallel; the same bytes
            # as a ring), their gradients reduce-scattered back in backward; the local queries
            # sit at positions cp_rank*s.. of the whole sequence
            from torch.distributed.nn.functional import all_gather

            k = torch.cat(all_gather(k.contiguous(), group=self.cp_group), dim=1)
            v = torch.cat(all_gather(v.contiguous(), group=self.cp_group), dim=1)
            q_pos = self.cp_rank * s + torch.arange(s, device=x.device)
            mask = torch.arange(k.shape[1], device=x.device)[None, :] <= q_pos[:, None]
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        # enable_gqa: query head i reads KV head i // rep without materialising repeated K/V,
        # as flash attention does.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                             enable_gqa=self.rep > 1)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x) (Shazeer, 2020); GELU: w2(gelu(w1 x))."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.gated = m.ffn_type == "swiglu"
        self.w1 = nn.Linear(m.hidden, m.ffn_hidden, bias=False)
        self.w2 = nn.Linear(m.ffn_hidden, m.hidden, bias=False)
        self.w3 = nn.Linear(m.hidden, m.ffn_hidden, bias=False) if self.gated else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


def _save_matmuls_policy(ctx: object, op: object, *args: object,
                         **kwargs: object) -> CheckpointPolicy:
    return (CheckpointPolicy.MUST_SAVE if op in _SAVED_OPS
            else CheckpointPolicy.PREFER_RECOMPUTE)


_SAVED_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
}


class Block(nn.Module):
    """One transformer layer. ``recompute``: "full" keeps only the layer's input and recomputes
    the rest in backward (Chen et al., 2016); "selective" keeps the matmul and attention outputs
    and recomputes the cheap elementwise ops (norms, RoPE, SiLU, products) — PyTorch's selective
    activation checkpointing, the op-level analogue of Korthikanti et al. (2022)."""

    def __init__(self, m: ModelSpec) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(m.hidden, eps=1e-5)
        self.attention = Attention(m)
        self.ffn_norm = nn.RMSNorm(m.hidden, eps=1e-5)
        self.feed_forward = FeedForward(m)
        self.recompute: Recompute = "none"

    def _layer(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full":
            return checkpoint(self._layer, x, cos, sin, use_reentrant=False)
        if self.recompute == "selective":
            return checkpoint(self._layer, x, cos, sin, use_reentrant=False,
                              context_fn=partial(create_selective_checkpoint_contexts,
                                                 _save_matmuls_policy))
        return self._layer(x, cos, sin)


class Decoder(nn.Module):
    """Token ids in, logits out; a pipeline stage maps hidden states to hidden states."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, m: ModelSpec, seq_len: int) -> None:
        super().__init__()
        if m.is_moe:
            raise NotImplementedError("the validation harness builds dense models only")
        self.spec = m
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(m.vocab, m.hidden)
        self.layers = nn.ModuleDict({str(i): Block(m) for i in range(m.layers)})
        self.norm: nn.RMSNorm | None = nn.RMSNorm(m.hidden, eps=1e-5)
        self.output: nn.Linear | None = nn.Linear(m.hidden, m.vocab, bias=False)
        if m.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight  # type: ignore[union-attr]
        cos, sin = rope_tables(seq_len, m.d_head)
        # Not persistent: derived from the shape, and not counted as model state.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.cp_rank, self.cp_size = 0, 1

    def reset_rope(self) -> None:
        """Recompute the RoPE tables in place (after ``to_empty`` left them uninitialised)."""
        cos, sin = rope_tables(self.rope_cos.shape[0], self.spec.d_head,
                               device=self.rope_cos.device)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        cos, sin = self.rope_cos, self.rope_sin
        if self.cp_size > 1:  # this rank's sequence chunk sits at cp_rank * its length
            s = h.shape[1]
            cos = cos[self.cp_rank * s:(self.cp_rank + 1) * s]
            sin = sin[self.cp_rank * s:(self.cp_rank + 1) * s]
        for layer in self.layers.values():
            h = layer(h, cos, sin)
        if self.norm is not None:
            h = self.norm(h)
        return self.output(h) if self.output is not None else h

    def keep_stage(self, layer_ids: range, *, first: bool, last: bool) -> Decoder:
        """Delete everything outside one pipeline stage, in place."""
        for key in list(self.layers):
            if int(key) not in layer_ids:
                del self.layers[key]
        if not first:
            self.tok_embeddings = None
        if not last:
            self.norm = None
            self.output = None
        return self


def init_weights(model: Decoder, seed: int) -> None:
    """Deterministic init that depends only on the seed and each parameter's name (normal, std
    0.02; output projections scaled by 1/sqrt(2L), GPT-2's rule), so that every parallel layout
    and every pipeline stage of the same seed starts from the same weights."""
    std_out = 0.02 / math.sqrt(2 * model.spec.layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
                continue
            gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            std = std_out if name.endswith(("wo.weight", "w2.weight")) else 0.02
            p.copy_(torch.randn(p.shape, generator=gen) * std)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
