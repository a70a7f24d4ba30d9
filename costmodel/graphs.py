"""CUDA graphs: which of a layer's operations the host still issues one by one.

Megatron-Core captures a layer's forward and backward in CUDA graphs
(megatron/core/transformer/transformer_config.py, core_v0.16.0: ``cuda_graph_impl`` "local" is
its own CudaGraphManager, megatron/core/transformer/cuda_graphs.py; "transformer_engine" is
Transformer Engine's make_graphed_callables, driven by cuda_graphs.py TECudaGraphHelper), over the
modules ``cuda_graph_scope`` names (--cuda-graph-scope):

* no scope (or "full"): the whole TransformerLayer, every layer (cuda_graphs.py
  ``_layer_is_graphable``);
* "attn": TransformerLayer._forward_attention (input norm, self-attention, its bias-dropout-add);
* "mlp": _forward_mlp of a dense layer;
* "moe": _forward_mlp of a MoE layer, router to combine, which needs static shapes: token drop
  with padding to capacity (the config asserts "moe cuda graph is only supported with
  drop-padding MoE");
* "moe_router": _forward_mlp up to MoELayer.router (the pre-MLP norm, the router, and the shared
  experts unless they overlap the dispatch; transformer_layer.py
  ``_get_submodules_under_cudagraphs``); "moe_preprocess" adds the dispatcher's
  ``dispatch_preprocess`` (token counts, splits, the first permutation), the rest of the MoE
  layer runs eagerly (moe_layer.py ``maybe_skip_or_early_return_by_cudagraph``). Under the local
  impl a second graph captures the post-combine part (MoETransformerLayer
  ``cudagraph_manager_postprocess``);
* "full_iteration" (local only): forward and backward of every micro-batch in one graph.

A captured region costs the host one graph launch (replaying its backward graph another, both in
the backward's share ``BWD_HOST_FACTOR`` of the forward's issue) in place of issuing its kernels.
The GPU still runs every kernel of it, each as long: graph replay removes the host's issue, not the
kernels' work, and the per-kernel gap the GPU leaves (``kernel_overhead_s``) is kept. Graph memory
is not modelled: the graphs' static inputs are reused between micro-batches whose backward has
run (TECudaGraphHelper's sample reuse; make_graphed_callables' _reuse_graph_input_output_buffers
from TE 2.7) and the tensors a captured forward saves for its backward live in the graphs' pool
instead of the caching allocator: the same activations the memory model counts, and the code
gives no further size (it logs what a capture took, cuda_graphs.py create_cudagraphs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from costmodel.errors import SpecError

GRAPH_IMPLS = ("none", "local", "transformer_engine")
# the --cuda-graph-scope values of a language model (CudaGraphScope: "mamba" has no layer here)
GRAPH_SCOPES = ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")
GRAPH_LAUNCH_OPS = 1.0  # one replay of a captured region, as one issued operation
# a layer's segments in the order they run: a run of captured ones is one graph
DENSE_SEGMENTS = ("attn", "mlp")
MOE_SEGMENTS = ("attn", "router", "preprocess", "experts", "postprocess")


def graph_scope(impl: str, scope: Sequence[str]) -> tuple[str, ...]:
    """The scope as Megatron-Core normalises it ("full" is the whole layer: no scope; the local
    impl captures moe_router and moe_preprocess together), or :class:`SpecError` for what
    TransformerConfig.__post_init__ refuses whatever the model (core_v0.16.0)."""
    if impl not in GRAPH_IMPLS:
        raise SpecError(f"training.cuda_graph_impl must be one of {list(GRAPH_IMPLS)}, "
                        f"but got {impl!r}")
    # a string is comma-separated, as TransformerConfig splits it
    names = tuple(scope.split(",") if scope else ()) if isinstance(scope, str) else tuple(scope)
    if names == ("full",):
        names = ()
    bad = [s for s in names if s not in GRAPH_SCOPES]
    if bad:
        raise SpecError(f"training.cuda_graph_scope must name scopes of {list(GRAPH_SCOPES)} "
                        f"(or be ['full'] alone), but got {list(scope)}")
    errors = []
    if impl == "transformer_engine" and "full_iteration" in names:
        errors.append("full_iteration needs cuda_graph_impl local")
    if "moe" in names and "moe_router" in names:
        errors.append("moe and moe_router exclude each other")
    if impl == "local" and ("moe_router" in names or "moe_preprocess" in names):
        names = tuple(dict.fromkeys((*names, "moe_router", "moe_preprocess")))
    if "moe_preprocess" in names and "moe_router" not in names:
        errors.append("moe_preprocess needs moe_router")
    if errors:
        raise SpecError(f"training.cuda_graph_scope {list(scope)} with cuda_graph_impl "
                        f"{impl!r}: {'; '.join(errors)}")
    return names


def captured_segments(impl: str, scope: Sequence[str], moe_layer: bool) -> frozenset[str]:
    """The segments of a layer (:data:`DENSE_SEGMENTS`, :data:`MOE_SEGMENTS`) its graphs hold."""
    if impl == "none":
        return frozenset()
    segments = MOE_SEGMENTS if moe_layer else DENSE_SEGMENTS
    if not scope or "full_iteration" in scope:
        return frozenset(segments)
    out = {"attn"} if "attn" in scope else set()
    if not moe_layer:
        return frozenset(out | ({"mlp"} if "mlp" in scope else set()))
    if "moe" in scope:
        return frozenset(out | {"router", "preprocess", "experts", "postprocess"})
    if "moe_router" in scope:
        out.add("router")
        if impl == "local":  # MoETransformerLayer's router and postprocess graphs
            out.add("postprocess")
    if "moe_preprocess" in scope:
        out.add("preprocess")
    return frozenset(out)


def host_ops(ops: Mapping[str, np.ndarray | float], order: Sequence[str], impl: str,
             scope: Sequence[str]) -> np.ndarray:
    """Operations the host issues for one layer forward: the segments no graph holds, one
    launch per run of captured segments; none per layer under a full-iteration graph (one launch
    a step)."""
    captured = captured_segments(impl, scope, order == MOE_SEGMENTS)
    if impl != "none" and "full_iteration" in scope:
        return np.asarray(0.0)
    total: np.ndarray = np.asarray(0.0)
    previous = False
    for name in order:
        inside = name in captured
        total = total + (GRAPH_LAUNCH_OPS if inside and not previous else
                         0.0 if inside else ops[name])
        previous = inside
    return total


def graphs_allowed(recompute_full: np.ndarray, impl: str, scope: Sequence[str], moe_layers: int,
                   layers: int, pad_to_capacity: bool, a2a_overlap: np.ndarray) -> np.ndarray:
    """What Megatron-Core refuses of CUDA graphs beside a plan and a model (the rule
    ``cuda_graphs`` of costmodel.rules; megatron/core/transformer/transformer_config.py
    __post_init__, core_v0.16.0): full recompute only under a full-iteration graph ("full
    recompute is only supported with full iteration CUDA graph"); the moe scopes only on a MoE
    model ("moe cuda graph is only supported for MoE"), mlp only where some layer is dense; moe
    only with token drop and padding ("moe cuda graph is only supported with drop-padding MoE"),
    and so the whole layer and the full iteration, whose capture would hold the dropless
    dispatcher's wait on the host (token_dispatcher.py _maybe_dtoh_and_synchronize:
    d2h_event.synchronize(), which stream capture forbids); with
    --overlap-moe-expert-parallel-comm, the transformer_engine impl without moe or mlp ("CUDA
    graph scope on moe and mlp is not supported with overlap_moe_expert_parallel_comm")."""
    if impl == "none":
        return np.ones_like(np.asarray(recompute_full), dtype=bool)
    moe, names = moe_layers > 0, set(scope)
    whole = not scope or "full_iteration" in names
    scopes_ok = ((moe or not names & {"moe", "moe_router", "moe_preprocess"})
                 and ("mlp" not in names or moe_layers < layers))
    static_ok = not moe or pad_to_capacity or not (whole or "moe" in names)
    overlap_ok = ~np.asarray(a2a_overlap, dtype=bool) | (impl == "transformer_engine"
                                                        and not names & {"moe", "mlp"})
    recompute_ok = ~np.asarray(recompute_full, dtype=bool) | ("full_iteration" in names)
    return recompute_ok & overlap_ok & bool(scopes_ok and static_ok)
