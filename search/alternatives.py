"""What a study left out would give: the best plan with context parallelism searched, or at the
nearest global batches that admit the layouts the batch's divisors pruned. Each is the same
space pruned again and every feasible layout judged (``Evaluator.exhaustive``), and becomes one
``note:`` line after the table (issue #38)."""

from __future__ import annotations

import dataclasses
import math
from functools import reduce

import numpy as np

from search.evaluate import Evaluator
from search.inputs.specs import Specs
from search.inputs.study import Study
from search.prune import memory_stage
from search.space import Layouts, build_space, enumerate_layouts

# Context parallelism is worth searching from here on: at 16k tokens a sequence's attention
# scores and activations grow past what TP and recompute trim cheaply, and the published
# long-context recipes turn CP on from 16k-32k (Megatron-Bridge's Llama 3 8B 16k/64k/128k).
# Below it the note's extra search is skipped: CP only splits a sequence that fits anyway.
CP_NOTE_MIN_SEQ = 16384
# the feasible layouts judged for a note at most: beyond, the note names only the batch
NOTE_MAX_LAYOUTS = 200_000


def best_tokens_per_s(study: Study, specs: Specs) -> float | None:
    """The best tokens/s per GPU of the study's space, every feasible layout judged; None where
    none fits or the space is too large to judge cheaply."""
    space = build_space(study, specs)
    layouts = enumerate_layouts(space)
    stage = memory_stage(specs, space, layouts.columns, specs.headroom_gib)
    ev = Evaluator(study, specs, stage, np.flatnonzero(stage.feasible))
    if not 0 < len(ev.feasible) <= NOTE_MAX_LAYOUTS:
        return None
    best = ev.exhaustive(1).best
    return float(best[0].metrics["tokens_per_s_per_gpu"]) if best else None


def cp_note(study: Study, specs: Specs, found: float | None) -> str | None:
    """Where the study left ``search_space.cp`` at its default (cp 1) on a long sequence: what
    ``cp: auto`` gives."""
    section = study.search_space
    if "cp" in section.model_fields_set or specs.training.seq_len < CP_NOTE_MIN_SEQ:
        return None
    wide = study.model_copy(update={"search_space": section.model_copy(update={"cp": "auto"})})
    best = best_tokens_per_s(wide, specs)
    if best is None:
        return None
    gain = f" ({best / found - 1:+.0%})" if found else ""
    return (f"search_space.cp: context parallelism was not searched (default cp 1); with "
            f"cp: auto the best plan gives {best:,.0f} tokens/s per GPU{gain}")


def batch_note(study: Study, specs: Specs, layouts: Layouts, found: float | None
               ) -> str | None:
    """Where the global batch's divisors pruned layouts (rule ``batch``): the nearest batches
    below and above that every pruned layout's dp divides (at micro-batch 1), with the best
    tokens/s each gives."""
    pruned = layouts.pruned_by.get("batch", 0)
    if not pruned:
        return None
    b, n_gpus = specs.training.global_batch, specs.cluster.num_gpus
    # the data-parallel sizes the batch rules out at any micro-batch (only larger micro-batches
    # pruned is no layout lost)
    dps = [d for d in range(2, n_gpus + 1) if n_gpus % d == 0 and b % d]
    if not dps:
        return None
    step = reduce(math.lcm, dps, 1)
    options = [n for n in (b // step * step, (b // step + 1) * step) if 0 < n != b]
    if not options:
        return None
    told = []
    for n in options:
        alt = study.model_copy(update={"training": study.training.model_copy(
            update={"global_batch": n, "global_batch_tokens": None})})
        at = dataclasses.replace(specs, training=dataclasses.replace(specs.training,
                                                                     global_batch=n))
        best = best_tokens_per_s(alt, at)
        gain = f" ({best / found - 1:+.0%})" if best and found else ""
        told.append(f"{n:,}" + (f": best {best:,.0f} tokens/s per GPU{gain}" if best else ""))
    return (f"training.global_batch: {b:,} sequences rule out data parallelism "
            f"{', '.join(map(str, dps))} (rule batch pruned {pruned:,} layouts); the nearest "
            f"batches that admit every dp are {' and '.join(told)}")
