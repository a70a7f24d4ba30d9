"""Multi-head latent attention's description (DeepSeek-AI, "DeepSeek-V2", 2024, sec. 2.1): the
ranks and head widths a model names; ``costmodel.attention`` gives the shapes they make."""

from __future__ import annotations

from dataclasses import dataclass

from costmodel.errors import TcfError


class MlaError(TcfError):
    """An MLA description breaks a rule; the message names the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MlaSpec:
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: queries projected from the hidden state directly (V2-Lite)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise MlaError(f"model.mla.{name} must be a whole number >= 1, but got {v!r}")
        q = self.q_lora_rank
        if not isinstance(q, int) or isinstance(q, bool) or q < 0:
            raise MlaError(f"model.mla.q_lora_rank must be a whole number >= 0, but got {q!r}")


MLA_FIELDS: tuple[str, ...] = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                               "qk_rope_head_dim", "v_head_dim")
