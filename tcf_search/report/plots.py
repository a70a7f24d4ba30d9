"""The report's figures, drawn with matplotlib's object API (no pyplot state, no display).

Each function takes the :class:`ResultData` of a result folder and returns a Figure, or None when
the folder holds nothing to draw (a study where no layout fits has no top plans). Text from the
folder is drawn as it is (``parse_math=False``): a ``$`` in a name is not TeX.
"""

from __future__ import annotations

import io
import textwrap
import warnings
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from tcf_search.report.data import ResultData, Trial
from tcf_search.report.schema import Cell, PlanRow

MEMORY = (("weights", "mem_weights_gib", "#4c72b0"), ("gradients", "mem_grads_gib", "#55a868"),
          ("optimizer", "mem_optimizer_gib", "#c44e52"),
          ("activations", "mem_activations_gib", "#dd8452"),
          ("buffers + overhead", "mem_buffers_gib", "#8172b3"))
STEP = (("compute (incl. recompute)", "time_compute_s", "#4c72b0"),
        ("exposed communication", "time_comm_exposed_s", "#c44e52"),
        ("pipeline bubble", "time_bubble_s", "#dd8452"),
        ("optimizer", "time_optimizer_s", "#55a868"))
PRUNED_COLOUR = "#d9d9d9"
UNTRIED_COLOUR = "#f2f2f2"


def plan_label(plan: PlanRow) -> str:
    rec = {"none": "", "selective": " sel", "full": " full"}[plan.recompute]
    extra = " ".join(f"{k}{getattr(plan, k)}" for k in ("ep", "vpp") if getattr(plan, k) > 1)
    cp = f" cp{plan.cp}" if plan.cp > 1 else ""
    # short lines: one long line per plan overlapped its neighbours' (issue #38)
    lines = [f"tp{plan.tp} pp{plan.pp}", f"dp{plan.dp}{cp}", extra,
             f"mbs{plan.micro_batch} z{plan.zero_stage}{rec}"]
    return "\n".join(x for x in lines if x)


def _top_labels(data: ResultData) -> list[str]:
    return [f"#{r.rank}\n{plan_label(r.plan)}" for r in data.top]


def memory_bars(data: ResultData) -> Figure | None:
    if not data.top:
        return None
    fig = Figure(figsize=(10, 4.4), layout="constrained")
    ax = fig.add_subplot()
    x = np.arange(len(data.top))
    bottom = np.zeros(len(x))
    for label, key, colour in MEMORY:
        vals = np.array([getattr(r.predicted, key) for r in data.top])
        ax.bar(x, vals, bottom=bottom, label=label, color=colour, width=0.7)
        bottom += vals
    usable = data.usable_gib
    if usable is not None:
        ax.axhline(usable, color="black", lw=1.5, label=f"usable HBM {usable:.1f} GiB")
        if data.headroom_gib:
            ax.axhline(usable - data.headroom_gib, color="black", ls="--", lw=1,
                       label=f"with {data.headroom_gib:g} GiB headroom")
    ax.set_xticks(x, _top_labels(data), fontsize=7)
    ax.set_ylabel("GiB per GPU (peak stage)")
    ax.set_title("Memory of the top plans against usable HBM")
    fig.legend(fontsize=7, loc="outside lower center", ncols=7)
    return fig


def step_breakdown(data: ResultData) -> Figure | None:
    if not data.top:
        return None
    fig = Figure(figsize=(10, 4.4), layout="constrained")
    ax = fig.add_subplot()
    y = np.arange(len(data.top))[::-1]
    left = np.zeros(len(y))
    for label, key, colour in STEP:
        vals = np.array([getattr(r.predicted, key) for r in data.top])
        ax.barh(y, vals, left=left, label=label, color=colour, height=0.7)
        left += vals
    step = np.array([r.predicted.step_time_s for r in data.top])
    rest = np.maximum(step - left, 0.0)
    if rest.max() > 0.005 * step.max():
        ax.barh(y, rest, left=left, label="other (stage imbalance)", color="#bbbbbb", height=0.7)
    ax.set_yticks(y, [s.replace("\n", "  ") for s in _top_labels(data)], fontsize=7)
    ax.set_xlabel("seconds per optimizer step")
    ax.set_title("Where the step goes")
    fig.legend(fontsize=7, loc="outside lower center", ncols=5)
    return fig


def pareto_front(points: np.ndarray) -> np.ndarray:
    """Indices of points (memory, throughput) no other point beats on both (less memory, more
    throughput), ordered by memory."""
    order = np.lexsort((-points[:, 1], points[:, 0]))
    front, best = [], -np.inf
    for i in order:
        if points[i, 1] > best:
            front.append(i)
            best = points[i, 1]
    return np.asarray(front, dtype=int)


def _complete(trials: list[Trial]) -> list[Trial]:
    return [t for t in trials if t.state == "complete" and t.tokens_per_s_per_gpu is not None
            and t.peak_mem_gib is not None]


def throughput_scatter(data: ResultData) -> Figure | None:
    trials = _complete(data.trials)
    if not trials:
        return None
    pts = np.array([[t.peak_mem_gib, t.tokens_per_s_per_gpu] for t in trials], dtype=float)
    fig = Figure(figsize=(7.5, 4.6), layout="constrained")
    ax = fig.add_subplot()
    ax.scatter(pts[:, 0], pts[:, 1], s=14, alpha=0.55, color="#4c72b0", label="trials")
    front = pts[pareto_front(pts)]
    ax.plot(front[:, 0], front[:, 1], "-o", color="#c44e52", ms=4, lw=1.5,
            label="Pareto front (less memory, more tokens/s)")
    if data.top:
        best = data.top[0].predicted
        ax.scatter([best.peak_mem_gib], [best.tokens_per_s_per_gpu], marker="*", s=220,
                   color="#dd8452", edgecolor="black", zorder=5, label="best plan")
    if data.baseline is not None:
        f = data.baseline.figures
        ax.scatter([f.peak_mem_gib], [f.tokens_per_s_per_gpu], marker="D", s=90,
                   color="white", edgecolor="black", lw=1.5, zorder=6,
                   label="baseline" + ("" if f.fits else " (does not fit)"))
    if data.usable_gib is not None:
        ax.axvline(data.usable_gib, color="black", lw=1, ls="--", label="usable HBM")
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens/s per GPU")
    ax.set_title("Throughput against memory, every trial")
    ax.legend(fontsize=7)
    return fig


def convergence(data: ResultData) -> Figure | None:
    trials = [t for t in data.trials if t.state == "complete" and t.value is not None]
    if not trials:
        return None
    objective = data.result.objective
    maximize = objective.direction == "maximize"
    x = np.array([t.number for t in trials])
    v = np.array([t.value for t in trials], dtype=float)
    running = np.maximum.accumulate(v) if maximize else np.minimum.accumulate(v)
    fig = Figure(figsize=(7.5, 4.0), layout="constrained")
    ax = fig.add_subplot()
    ax.scatter(x, v, s=10, alpha=0.5, color="#4c72b0", label="trial")
    ax.step(x, running, where="post", color="#c44e52", lw=2, label="best so far")
    optimum = data.result.optimum
    if optimum is not None:
        ax.axhline(optimum.value, color="black", ls="--", lw=1, label="exhaustive optimum")
    ax.set_xlabel("trial")
    ax.set_ylabel(objective.metric.replace("_", " "), parse_math=False)
    sampler = data.result.search.sampler
    ax.set_title(f"Search convergence ({sampler}, {len(trials)} trials)", parse_math=False)
    ax.legend(fontsize=7)
    return fig


def cell_reason(cell: Cell) -> str:
    """The constraint that removed every layout of a (tp, pp) cell."""
    if cell.valid > 0:
        return "memory"
    counts = {k: v for k, v in cell.pruned_by.items() if k != "memory"}
    return max(counts, key=lambda k: counts[k]) if counts else "empty"


def layout_heatmap(data: ResultData) -> Figure | None:
    cells = data.result.cells
    if not cells:
        return None
    tps = sorted({c.tp for c in cells})
    pps = sorted({c.pp for c in cells})
    # each cell's own best plan (search.pipeline.cells); older results: the best trial there
    best: dict[tuple[int, int], float] = {
        (c.tp, c.pp): c.best_tokens_per_s_per_gpu for c in cells
        if c.best_tokens_per_s_per_gpu is not None}
    for trial in [] if best else _complete(data.trials):
        if trial.tp is None or trial.pp is None or trial.tokens_per_s_per_gpu is None:
            continue
        key = (trial.tp, trial.pp)
        best[key] = max(best.get(key, 0.0), trial.tokens_per_s_per_gpu)
    grid = np.full((len(tps), len(pps)), np.nan)
    fig = Figure(figsize=(1.1 * len(pps) + 2.5, 0.75 * len(tps) + 1.6), layout="constrained")
    ax = fig.add_subplot()
    by_key = {(c.tp, c.pp): c for c in cells}
    for (t, p), value in best.items():
        if (t, p) in by_key:
            grid[tps.index(t), pps.index(p)] = value
    for c in cells:
        i, j = tps.index(c.tp), pps.index(c.pp)
        if c.feasible == 0:
            colour = PRUNED_COLOUR
            text = textwrap.fill(cell_reason(c).replace("_", " "), 10)
        elif np.isnan(grid[i, j]):
            top_val = c.best_in_top
            colour = UNTRIED_COLOUR
            text = f"{top_val:,.0f}" if top_val else f"{c.feasible} fit\nnot tried"
        else:
            continue
        ax.add_patch(_rect(j, i, colour))
        ax.text(j, i, text, ha="center", va="center", fontsize=6.5, color="#444444",
                parse_math=False)
    masked = np.ma.masked_invalid(grid)
    img = ax.imshow(masked, cmap="viridis", aspect="auto", origin="lower")
    for (i, j), value in np.ndenumerate(grid):
        if not np.isnan(value):
            ax.text(j, i, f"{value:,.0f}", ha="center", va="center", fontsize=7,
                    color="white" if value < np.nanmax(grid) * 0.97 else "black")
    _baseline_cell(ax, data, tps, pps)
    ax.set_xticks(range(len(pps)), [str(p) for p in pps])
    ax.set_yticks(range(len(tps)), [str(t) for t in tps])
    ax.set_xlim(-0.5, len(pps) - 0.5)
    ax.set_ylim(-0.5, len(tps) - 0.5)
    ax.set_xlabel("pipeline parallel (pp)")
    ax.set_ylabel("tensor parallel (tp)")
    ax.set_title("Best tokens/s per GPU by (tp, pp); grey: pruned, labelled by the constraint")
    fig.colorbar(img, ax=ax, label="best tokens/s per GPU", shrink=0.85)
    return fig


def _baseline_cell(ax: Any, data: ResultData, tps: list[int], pps: list[int]) -> None:
    """The baseline's (tp, pp) cell outlined in red; a baseline off the grid is said in the
    title's place instead (its tp or pp is not among the searched values)."""
    if data.baseline is None:
        return
    tp, pp = data.baseline.plan.tp, data.baseline.plan.pp
    if tp in tps and pp in pps:
        from matplotlib.patches import Rectangle

        j, i = pps.index(pp), tps.index(tp)
        ax.add_patch(Rectangle((j - 0.46, i - 0.46), 0.92, 0.92, fill=False, edgecolor="red",
                               lw=2.2, zorder=6))
        ax.text(j, i - 0.32, "baseline", ha="center", va="center", fontsize=6, color="red",
                zorder=7)
    else:
        ax.text(0.5, -0.02, f"baseline tp={tp}, pp={pp} is off this grid",
                transform=ax.transAxes, ha="center", va="top", fontsize=7, color="red")


def _rect(x: float, y: float, colour: str) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x - 0.5, y - 0.5), 1, 1, facecolor=colour, edgecolor="white", lw=1)


FIGURES = (("memory", memory_bars), ("step_time", step_breakdown),
           ("throughput_vs_memory", throughput_scatter), ("convergence", convergence),
           ("layout_heatmap", layout_heatmap))


def png_bytes(fig: Figure, dpi: int = 130) -> bytes:
    """The figure as PNG (one rendering serves the page and the static file: SVG text of these
    figures is ~5x larger and slower to write)."""
    buf = io.BytesIO()
    with warnings.catch_warnings():  # a name in a script the font lacks is drawn as boxes
        warnings.filterwarnings("ignore", r"Glyph \d+ .* missing from font", UserWarning)
        fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()

