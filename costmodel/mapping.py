"""Where layers and micro-batches sit: layers per pipeline stage, micro-batches in flight, and
which link tier each parallel group spans.

Rank order follows Megatron-LM (tp fastest, then cp, then dp, then pp), so the TP group is packed
inside a node first. In-flight micro-batches follow Narayanan et al. (SC21, sec. 2.2) for 1F1B and
interleaved 1F1B, and GPipe (Huang et al., 2019) holds all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from costmodel.plans import PlanArrays
from costmodel.specs import ModelSpec

STAGES: tuple[str, ...] = ("first", "middle", "last")


@dataclass(frozen=True, slots=True)
class StageLayers:
    first: np.ndarray
    middle: np.ndarray  # the most loaded middle rank's (rank 1's: :func:`ranks_of`)
    last: np.ndarray  # the LM head's stage (it may hold no layer: nanotron's cost balance)
    # ranks after the head's that run the fp32 cast of the logits and the loss: 0 (with the
    # head), 1 (both on the next rank) or 2 (the cast, then the loss, each on its own rank;
    # :func:`cost_balanced_ranks`)
    loss_ranks: np.ndarray | None = None
    head_rank: np.ndarray | None = None  # the LM head's pipeline rank where loss_ranks is set
    # the middle ranks' mean where they differ by a layer (:func:`ranks_of`); None: ``middle``
    middle_mean: np.ndarray | None = None

    def of(self, stage: str) -> np.ndarray:
        return {"first": self.first, "middle": self.middle, "last": self.last}[stage]

    @property
    def largest(self) -> np.ndarray:
        return np.maximum(np.maximum(self.first, self.middle), self.last)

    @property
    def middle_share(self) -> np.ndarray:
        """The middle ranks' mean layers over the most loaded one's (1 where they are equal):
        what the sum over the middle ranks takes of ``pp - 2`` times the most loaded."""
        if self.middle_mean is None:
            return np.ones_like(self.middle, dtype=float)
        return np.where(self.middle > 0, self.middle_mean / np.maximum(self.middle, 1e-30), 1.0)


def ranks_of(num_layers: int, pp: ArrayLike, first: ArrayLike, last: ArrayLike
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Layers per pipeline rank as a per-rank layout places them: a pinned first/last rank (> 0)
    holds its count, and the other ranks share the rest as evenly as whole layers allow, the
    remainder one layer each on the earliest of them (80 layers on pp 32: ranks 0-15 hold 3,
    ranks 16-31 hold 2; pinned 2 + 2, the 30 middle ranks 76: 16 of 3, then 14 of 2). Returns
    (first, the most loaded middle rank, the middle ranks' mean, last, remainder) as integer
    arrays but the mean; the remainder is 0 exactly where the unpinned ranks hold equal
    shares. The earliest middle rank, rank 1, holds the most layers and the most micro-batches
    of the middle ones (:func:`inflight_micro_batches`), so it is the middle stage priced."""
    pp, first, last = (np.asarray(x, dtype=np.int64) for x in (pp, first, last))
    f_set, l_set = first > 0, last > 0
    free = np.maximum(pp - f_set - l_set, 1)
    rest = num_layers - np.where(f_set, first, 0) - np.where(l_set, last, 0)
    q, e = np.divmod(rest, free)
    e = np.where(pp - f_set - l_set > 0, e, 0)
    n_first = np.where(f_set, first, q + (e > 0))
    k0 = (~f_set).astype(np.int64)  # the free index of rank 1
    mids = np.maximum(pp - 2, 1)
    middle = np.where(pp > 2, q + (e > k0), n_first)
    mean = np.where(pp > 2, q + np.clip(e - k0, 0, mids) / mids, n_first)
    n_last = np.where(pp == 1, n_first, np.where(l_set, last, q))
    return n_first, middle, mean, n_last, e


def cost_balanced_ranks(num_layers: int, pp: int, layer_cost: float, head_cost: float
                        ) -> tuple[tuple[int, ...], int, int]:
    """Layers on each pipeline rank, the LM head's rank and the loss's rank as nanotron's
    ``build_model`` places its pipeline blocks (src/nanotron/models/base.py): in model order
    (src/nanotron/models/llama.py: the token embedding, the decoder layers, the final norm, the
    LM head, the fp32 cast of the logits, then LlamaForTraining's loss), each block goes to the
    current rank, which moves on once the running cost passes ``total * (rank + 1) / pp``. Only
    the layers (``layer_cost``: 4 h^2 + 3 f h) and the head (``head_cost``: vocab x h) cost
    anything (``get_block_compute_costs``), so the head's rank can hold no layer, and when the
    head passes its rank's share the cast and the loss go to the ranks after it (1B, vocab
    131072, pp 8: 3, 3, 2, 3, 2, 3 layers, then the head alone, then the cast and the loss)."""
    costs = [0.0] + [layer_cost] * num_layers + [0.0, head_cost, 0.0, 0.0]
    cum = np.cumsum(costs)
    thresholds = [cum[-1] * ((rank + 1) / pp) for rank in range(pp)]
    ranks, r = [], 0
    for c in cum:
        ranks.append(r)
        r += int(c > thresholds[r])
    per_rank = np.bincount(ranks[1:num_layers + 1], minlength=pp)
    return tuple(int(n) for n in per_rank), ranks[num_layers + 2], ranks[-1]


def head_balance(model: ModelSpec) -> tuple[float, float]:
    """A decoder layer's and the LM head's compute cost as nanotron's
    ``get_block_compute_costs`` counts them (4 h^2 + 3 f h; vocab x h), for
    :func:`cost_balanced_ranks`."""
    h, f = float(model.hidden), float(model.ffn_hidden)
    return 4 * h * h + 3 * f * h, float(model.vocab) * h


def cost_balanced_split(num_layers: int, pp: int, layer_cost: float, head_cost: float
                        ) -> tuple[int, int, int]:
    """The first rank's layers, the LM head's rank's layers (possibly none) and how many
    ranks after the head's run the cast and the loss (0, 1 or 2; the cast's own rank then
    comes between), by :func:`cost_balanced_ranks`."""
    per_rank, head_rank, loss_rank = cost_balanced_ranks(num_layers, pp, layer_cost, head_cost)
    return per_rank[0], per_rank[head_rank], loss_rank - head_rank


def stage_layers(num_layers: int, p: PlanArrays,
                 head_balance: tuple[float, float] | None = None) -> StageLayers:
    """Layers held by the first, the most loaded middle and the last pipeline stage, by
    :func:`ranks_of` (pinned ends, the rest as even as whole layers allow, the remainder on the
    earliest ranks: what a per-rank layout builds, and nanotron's remainder where nothing is
    pinned), with the middle ranks' mean for sums over them. ``head_balance`` (a layer's and
    the LM head's compute cost): plans that give no split place their layers by
    :func:`cost_balanced_split` (nanotron) instead; the middle stage is then the mean of the
    other ranks, those after the head's (holding the loss, or nothing) counted with none."""
    L, pp = float(num_layers), p.pp.astype(float)
    first, middle, mean, last, _ = (x.astype(float) for x in ranks_of(
        num_layers, p.pp, p.first_stage_layers, p.last_stage_layers))
    if head_balance is None:
        return StageLayers(first=first, middle=middle, last=last, middle_mean=mean)
    f_set, l_set = p.first_stage_layers > 0, p.last_stage_layers > 0
    unset = (p.pp > 1) & ~f_set & ~l_set
    split = {int(k): (*cost_balanced_split(num_layers, int(k), *head_balance),
                      cost_balanced_ranks(num_layers, int(k), *head_balance)[1])
             for k in np.unique(p.pp[unset])}
    bal_first, bal_last, loss_ranks, head_rank = (
        np.asarray([split.get(int(k), (0, 0, 0, 0))[i] for k in p.pp]) for i in range(4))
    first = np.where(unset, bal_first, first)
    last = np.where(unset, bal_last, last)
    balanced = np.where(pp > 2, (L - first - last) / np.maximum(pp - 2, 1), first)
    middle = np.where(unset, balanced, middle)
    return StageLayers(first=first, middle=middle, last=last,
                       loss_ranks=np.where(unset, loss_ranks, 0),
                       head_rank=np.where(unset, head_rank, pp - 1),
                       middle_mean=np.where(unset, balanced, mean))


def rank_split(num_layers: int, pp: ArrayLike, first: ArrayLike, last: ArrayLike,
               near_even: ArrayLike = False) -> tuple[StageLayers, np.ndarray]:
    """Layers on the first, the most loaded middle and the last pipeline rank as a launcher
    places them (:func:`ranks_of`), integer arrays, and whether the split is whole: every rank
    holds >= 1 layer, and the ranks whose count is not pinned hold equal shares (Megatron-LM's
    uneven pipeline, megatron/core/transformer/transformer_config.py ``__post_init__``) or,
    with ``near_even`` (the launcher takes a per-rank layout: Megatron-Core's
    ``--pipeline-model-parallel-layout``, torchtitan's per-stage module lists), shares that
    differ by one layer. A middle of 0 means there is no middle rank."""
    pp = np.asarray(pp, dtype=np.int64)
    first, last = (np.asarray(x, dtype=np.int64) for x in (first, last))
    n_first, middle, mean, n_last, e = ranks_of(num_layers, pp, first, last)
    f_set, l_set = first > 0, last > 0
    free = pp - f_set - l_set
    rest = num_layers - np.where(f_set, first, 0) - np.where(l_set, last, 0)
    shares = (e == 0) | np.asarray(near_even, dtype=bool)
    whole = np.where(free > 0, (rest >= free) & shares, rest == 0)
    whole &= (pp > 1) | ~(f_set | l_set)
    middle = np.where(pp > 2, middle, 0)
    return StageLayers(first=n_first, middle=middle, last=n_last,
                       middle_mean=np.where(pp > 2, mean, 0.0)), whole


def stage_counts(num_layers: int, pp: int, first: int, last: int,
                 near_even: bool = False) -> tuple[int, ...]:
    """Layers per pipeline rank, in rank order, by :func:`ranks_of`; () when not whole
    (:func:`rank_split`)."""
    one = np.asarray([pp])
    _, whole = rank_split(num_layers, one, np.asarray([first]), np.asarray([last]), near_even)
    if not bool(whole[0]):
        return ()
    if pp == 1:
        return (num_layers,)
    n_first, most, mean, n_last, _ = (x[0] for x in ranks_of(
        num_layers, one, np.asarray([first]), np.asarray([last])))
    mids = pp - 2
    # the middle ranks: the most loaded ones first, then those one layer short (ranks_of)
    held = int(round(float(mean) * mids))
    top = held - (int(most) - 1) * mids if held != int(most) * mids else mids
    middle = [int(most)] * top + [int(most) - 1] * (mids - top)
    return (int(n_first), *middle, int(n_last))


def chunk_counts(rank_layers: tuple[int, ...], vpp: int) -> tuple[int, ...]:
    """Layers of each model chunk in virtual-stage order, Megatron-LM's interleaved placement:
    chunk c of pipeline rank r is virtual stage ``c * pp + r`` and holds ``rank_layers[r] / vpp``
    layers. A rank short of whole chunks (the embedding or the loss counted as a layer,
    :func:`launchable_chunks`) misses them from its first chunks on rank 0 (the embedding's)
    and from its last chunks elsewhere (the loss's)."""
    pp = len(rank_layers)
    out = [[0] * pp for _ in range(vpp)]
    for rank, n in enumerate(rank_layers):
        base = -(-n // vpp)
        short = vpp * base - n
        for chunk in range(vpp):
            missing = chunk < short if rank == 0 else chunk >= vpp - short
            out[chunk][rank] = base - int(missing)
    return tuple(n for chunk in out for n in chunk)


def counted_split(num_layers: int, pp: int, embedding: bool, loss: bool) -> tuple[int, int]:
    """First and last pipeline ranks' transformer layers when the embedding and the loss count
    as one layer each (Megatron-LM's ``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split``, megatron/core/transformer/transformer_config.py,
    ``__post_init__``): the ``layers + e + l`` units split evenly over the pp ranks, so rank 0
    holds one transformer layer fewer for the embedding and the last rank one fewer for the loss.
    (0, 0) when neither counts or without a pipeline (Megatron-Core accepts the flags at pp 1:
    any count of units divides over one rank, which holds every layer; transformer_block.py
    ``get_num_layers_to_build``); (-1, -1) when the units do not split evenly or a rank would
    hold no transformer layer. Example: 126 layers, pp 16, both counted: 128 / 16 = 8 units a
    rank, so 7 + 14 * 8 + 7 (Llama 3.1 405B, Dubey et al. 2024, sec. 3.3)."""
    if not (embedding or loss) or pp < 2:
        return 0, 0
    units = num_layers + int(embedding) + int(loss)
    share = units // pp
    if units % pp or share - 1 < 1:
        return -1, -1
    return share - int(embedding), share - int(loss)


def launchable_chunks(num_layers: int, pp: ArrayLike, vpp: ArrayLike, first: ArrayLike,
                      last: ArrayLike) -> np.ndarray:
    """Whether Megatron-LM builds vpp model chunks per rank from this split with its own flags
    (transformer_config.py ``__post_init__`` and megatron/training/arguments.py):

    * even (nothing pinned): ``layers % (pp * vpp) == 0``;
    * ``--decoder-first/last-pipeline-num-layers``: the first, last and each middle rank's
      layers are each divisible by vpp;
    * ``--account-for-embedding/loss-in-pipeline-split``: the ranks hold c - e, c, ..., c - l
      layers (e, l in {0, 1}) with c divisible by vpp; the embedding and the loss fill the
      first and last chunk's missing layer.

    Any other split needs ``--pipeline-model-parallel-layout`` (see ``Switches.uneven_chunks``).
    """
    pp, vpp, first, last = (np.asarray(x, dtype=np.int64) for x in (pp, vpp, first, last))
    nf, nm, _, nl, e = ranks_of(num_layers, pp, first, last)
    v = np.maximum(vpp, 1)
    # Megatron's flags split the unpinned ranks' layers evenly: shares differing by a layer
    # need the explicit layout
    flags = (e == 0) & (nf % v == 0) & (nl % v == 0) & ((pp <= 2) | (nm % v == 0))
    hi, lo = np.maximum(nf, nl), np.minimum(nf, nl)
    # c: the units a rank holds; the middle ranks' layers, or with pp == 2 the larger end (or
    # one more when both ends give a layer to the embedding and the loss)
    counted_mid = (nm % v == 0) & (nf <= nm) & (nf >= nm - 1) & (nl <= nm) & (nl >= nm - 1)
    counted_two = (((hi % v == 0) & (lo >= hi - 1)) | ((nf == nl) & ((nf + 1) % v == 0)))
    counted = (e == 0) & np.where(pp > 2, counted_mid, counted_two)
    pinned = (first > 0) | (last > 0)
    even = num_layers % np.maximum(pp * v, 1) == 0
    return (vpp <= 1) | np.where(pinned, flags | counted, even)


def chunk_split_exists(num_layers: int, pp: ArrayLike, vpp: ArrayLike,
                       any_split: bool = False) -> np.ndarray:
    """Whether some split of the layers over pp ranks passes :func:`launchable_chunks` (the
    search places the split after its rules run): whole chunks of the first/last flags
    (``layers % vpp == 0`` and ``vpp`` layers a rank at least), or the embedding and/or the
    loss counted (``(layers + k) % (pp * vpp) == 0`` for k = 0, 1, 2, a rank holding 2 or more
    units when any is counted). ``any_split`` (an explicit per-stage layout, Megatron-Core's
    ``--pipeline-model-parallel-layout``): any split with a layer on every rank."""
    pp, vpp = (np.asarray(x, dtype=np.int64) for x in (pp, vpp))
    L, v = num_layers, np.maximum(vpp, 1)
    if any_split:
        return (vpp <= 1) | ((pp > 1) & (pp <= L))
    flags = (L % v == 0) & (L >= pp * v)
    counted = np.zeros(np.broadcast(pp, vpp).shape, dtype=bool)
    for k in (0, 1, 2):
        counted |= ((L + k) % (pp * v) == 0) & ((L + k) // np.maximum(pp, 1) >= 1 + (k > 0))
    return (vpp <= 1) | ((pp > 1) & (flags | counted))


def micro_batches(global_batch: int, p: PlanArrays) -> np.ndarray:
    """Micro-batches per DP rank per optimizer step (gradient accumulation steps)."""
    return np.maximum(global_batch / (p.dp * p.micro_batch), 1.0)


def inflight_micro_batches(p: PlanArrays, m: np.ndarray, stage: str,
                           one_more: ArrayLike = False) -> np.ndarray:
    """Micro-batches whose activations a stage holds at its peak, in units of its whole layers.

    1F1B: rank r holds min(m, p - r). Interleaved (v chunks): the warm-up holds
    2(p - r - 1) + (v - 1)p + 1 chunk-micro-batches, each 1/v of the stage, and one more where
    ``one_more`` (Megatron-Core's combined 1F1B of the EP all-to-all overlap:
    :func:`costmodel.dispatch.warms_up_one_more`). GPipe holds all m.
    """
    pp, v = p.pp.astype(float), p.vpp.astype(float)
    # "middle" is the most loaded middle stage, rank 1: it holds one micro-batch fewer than the
    # first stage but may hold more layers when the first stage is shortened
    rank = {"first": 0.0, "middle": np.minimum(1.0, pp - 1), "last": pp - 1}[stage]
    one_f_one_b = np.minimum(m, pp - rank)
    warm = 2 * (pp - rank - 1) + (v - 1) * pp + 1 + np.asarray(one_more, dtype=float)
    interleaved = np.minimum(m * v, warm) / v
    held = np.where(p.vpp > 1, interleaved, one_f_one_b)
    return np.where(p.pp_schedule == 2, m, held)


def expert_groups(tp: ArrayLike, cp: ArrayLike, dp: ArrayLike, ep: ArrayLike,
                  given_etp: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(expert TP, expert DP, the expert TP a plan that gives none gets) over plain columns
    (the validity rules read them too). Megatron-Core's MoE parallel folding
    (megatron/core/parallel_state.py ``initialize_model_parallel``): the expert ranks of a
    pipeline stage are ordered expert-TP, EP, expert-DP over its tp x cp x dp ranks. Expert TP
    is the plan's, or derived: Megatron's default ``--expert-tensor-parallel-size`` is tp, and
    where EP does not divide dp * cp it spans tp x cp x dp with expert TP 1."""
    tp, cp, dp, ep, given = (np.asarray(x, dtype=np.int64) for x in (tp, cp, dp, ep, given_etp))
    derived = np.where((dp * cp) % ep != 0, 1, tp)
    etp = np.where(given > 0, given, derived)
    return etp, tp * cp * dp // (ep * etp), derived


def expert_tp(p: PlanArrays) -> np.ndarray:
    """The routed experts' tensor parallelism (:func:`expert_groups`)."""
    return expert_groups(p.tp, p.cp, p.dp, p.ep, p.expert_tp)[0]


def expert_dp(p: PlanArrays) -> np.ndarray:
    """Replicas of each expert shard: the ranks of a pipeline stage over ep x expert TP
    (Megatron-Core's expert_data_parallel group; torchtitan's ``efsdp``)."""
    return expert_groups(p.tp, p.cp, p.dp, p.ep, p.expert_tp)[1]


