"""The explanation document on a terminal (also recorded to HTML/SVG for the report)."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from search import MFU_FLAG, interval_text
from tcf_search.explain.analysis import MEMORY_PARTS


def _gib(x: float) -> str:
    return f"{x:.1f}"


def _bytes(x: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"


def _memory(doc: dict[str, Any], con: Console) -> None:
    m = doc["memory"]
    verdict = (f"[green]fits[/green], {m['headroom_gib']:.1f} GiB to spare" if m["fits"] else
               f"[bold red]does not fit[/bold red]: {-m['headroom_gib']:.1f} GiB over")
    con.print(f"[bold]1. Memory[/bold] per GPU, peak on the {m['peak_stage']} stage: "
              f"{m['peak_gib']:.1f} of {m['usable_gib']:.1f} GiB usable — {verdict}")
    t = Table(show_edge=False, header_style="bold", pad_edge=False)
    t.add_column("stage")
    t.add_column("layers", justify="right")
    for p in MEMORY_PARTS:
        t.add_column(p, justify="right")
    t.add_column("total GiB", justify="right")
    t.add_column("vs usable", justify="right")
    for st in m["stages"]:
        room = st["headroom_gib"]
        t.add_row(st["stage"], str(st["layers"]), *(_gib(st[f"{p}_gib"]) for p in MEMORY_PARTS),
                  _gib(st["total_gib"]),
                  f"[green]{room:+.1f}[/green]" if room >= 0 else f"[red]{room:+.1f}[/red]")
    con.print(t)
    if m.get("host_gib"):
        con.print(f"   activations offloaded to host memory: {m['host_gib']:.1f} of "
                  f"{m['host_usable_gib']:.1f} GiB the GPU may pin; the copies over the host "
                  "link (communication, tier host) at a prior fraction of its line rate, "
                  "unvalidated: no measured run offloads")


def _stall(c: dict[str, Any], step_s: float) -> str:
    """The allocator's expected stall, where the plan's peak comes near enough to capacity for
    it to be half a percent of the step."""
    s = c.get("stall_time_s", 0.0)
    if s < 0.005 * step_s:
        return ""
    return (f"; [yellow]{s:.2f} s expected of the caching allocator freeing and retrying[/yellow]: "
            f"a {c['stall_chance']:.0%} chance the peak passes usable memory, and then the step "
            f"takes {1 + c['stall_slowdown']:.1f}x")


def _compute(doc: dict[str, Any], con: Console) -> None:
    c, step = doc["compute"], doc["step"]
    con.print(f"\n[bold]2. Compute[/bold]: {c['model_flops_per_gpu'] / 1e15:.2f} PFLOP model / "
              f"{c['hardware_flops_per_gpu'] / 1e15:.2f} PFLOP hardware per GPU per step; "
              f"GEMMs at {c['gemm_efficiency']:.0%} of {c['peak_tflops_per_gpu']:.0f} TFLOP/s")
    what = (f": selective recomputes {doc['training']['selective_recomputes']}"
            if doc["plan"]["recompute"] == "selective" else "")
    con.print(f"   kernels {c['time_s']:.2f} s (recompute {c['recompute_time_s']:.2f} s, "
              f"{c['recompute_share']:.0%}{what}; slowed {c['contention_time_s']:.2f} s by the "
              f"communication it hides{_stall(c, step['step_time_s'])}), "
              f"bubble {c['bubble_time_s']:.2f} s "
              f"({c['bubble_share']:.1%} of the step), optimizer {c['optimizer_time_s']:.3f} s")
    if c.get("pipeline"):
        _pace(c["pipeline"], con)
    own = ("" if c["peak_tflops_per_gpu"] == c["bf16_peak_tflops_per_gpu"]
           else f" ({c['mfu_precision_peak']:.1%} of the {c['peak_tflops_per_gpu']:.0f} TFLOP/s "
                f"peak of the plan's precision)")
    con.print(f"   MFU {c['mfu']:.1%}{own}, HFU {c['hfu']:.1%}, "
              f"{c['model_tflops_per_gpu']:.0f} model TFLOP/s per GPU; "
              f"{step['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
              f"step {step['step_time_s']:.2f} s")
    con.print(f"   [dim]{c['flop_convention']}[/dim]")
    if c["mfu"] > MFU_FLAG or c["mfu_causal"] < 0.9 * c["mfu"]:
        con.print(f"   MFU with causal attention (the scores a causal mask computes, about half): "
                  f"{c['mfu_causal']:.1%}"
                  + (f" (flagged: the convention's {c['mfu']:.1%} is above {MFU_FLAG:.0%} of "
                     f"the peak; published dense runs report 35-60%)"
                     if c["mfu"] > MFU_FLAG else ""))


def _pace(stages: list[dict[str, Any]], con: Console) -> None:
    """Each stage's micro-batch and which one the pipeline steps at."""
    ends = {"first": " + the embedding", "last": " + the LM head and loss"}
    slow = next(s for s in stages if s["paces"])
    idle = max(s["waits_share"] for s in stages)
    con.print("   pipeline pace, one micro-batch forward and backward: " + ", ".join(
        f"{s['stage']} {s['total_s'] * 1e3:,.1f} ms "
        f"({s['layers']} layers{ends.get(s['stage'], '')})" for s in stages)
        + (f": the step runs at the {slow['stage']} stage's pace, the least loaded waits "
           f"{idle:.0%} of it" if idle >= 0.05 else ": balanced within 5%"))


def _communication(doc: dict[str, Any], con: Console) -> None:
    k = doc["communication"]
    con.print(f"\n[bold]3. Communication[/bold]: {_bytes(k['bytes'])} per GPU per step, "
              f"{k['time_s']:.2f} s on the links, {k['exposed_s']:.2f} s exposed, "
              f"{k['hidden_s']:.2f} s hidden under compute")
    if not k["collectives"]:
        con.print("   none (a single GPU)")
        return
    t = Table(show_edge=False, header_style="bold", pad_edge=False)
    for col, just in (("collective", "left"), ("group", "left"), ("size", "right"),
                      ("tier", "left"), ("bytes", "right"), ("time s", "right"),
                      ("exposed s", "right"), ("hidden s", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for c in k["collectives"]:
        t.add_row(c["name"], c["group"], str(c["group_size"]), c["tier"], _bytes(c["bytes"]),
                  f"{c['time_s']:.2f}", f"{c['exposed_s']:.2f}", f"{c['hidden_s']:.2f}")
    con.print(t)
    if "placement" in k:
        _placement(k["placement"], con)
    if d := k.get("moe_dispatch"):
        t = d["training"]
        con.print(f"   MoE dispatch: {DISPATCHERS[d['dispatcher']]}, the EP all-to-all "
                  + ("overlapped with another micro-batch's compute" if d["a2a_overlap"]
                     else "not overlapped")
                  + (f" (the plan's own; the training's: {t['dispatcher']}, "
                     f"{'overlapped' if t['a2a_overlap'] else 'not overlapped'})"
                     if d["plan_own"] else " (the training's)"))
        if "sm_share" in d:
            con.print(f"   its kernels hold {d['sm_share']:.0%} of the SMs while they run: the "
                      "compute beside them runs on the rest, counted in its exposed time")
        if r := d.get("reach"):
            limit = (f", {r['uniform']:.2f} without its router's limit to {r['groups'][0]} of "
                     f"{r['groups'][1]} expert groups" if r["groups"] else "")
            con.print(f"   a token's copies reach {r['hit']:.2f} of the EP group's "
                      f"{r['nodes']:g} nodes, its own among them as DeepEP counts the RDMA "
                      f"stage{limit}")


DISPATCHERS = {"alltoall": "alltoall (NCCL all-to-all of every routed copy)",
               "allgather": "allgather (every token gathered over TP x EP)",
               "flex": "flex (DeepEP: a token once per destination rank and node)"}


def _placement(at: dict[str, Any], con: Console) -> None:
    """Where each group sits (the framework's rank order) and every pipeline hop's link."""
    con.print(f"   placement ({at['rank_order']}, NVLink domains of {at['nvlink_domain']} GPUs, "
              f"nodes of {at['gpus_per_node']}): " + "; ".join(
                  f"{g['group']} {g['size']} = {g['per_domain']}/domain x {g['domains']} "
                  f"domain{'s' if g['domains'] > 1 else ''} on {g['nodes']} "
                  f"node{'s' if g['nodes'] > 1 else ''}" + (" (network)" if g["network"] else "")
                  for g in at["groups"]) or "   placement: one GPU")
    if at.get("oversubscription", 1.0) > 1.0 and at.get("rail_group_nodes", 0) > 0:
        con.print(f"   fabric: rail groups of {at['rail_group_nodes']} nodes, spine "
                  f"oversubscribed {at['oversubscription']:g}:1 (an EP all-to-all leaving its "
                  "group drains there)")
    if at["pp_hops"]:
        con.print("   pipeline hops: " + ", ".join(
            f"{h['from_stage']}→{h['to_stage']} {h['link']}" for h in at["pp_hops"])
            + (" (a step runs at its slowest hop's pace)"
               if any(h["link"] == "network" for h in at["pp_hops"]) else ""))


def _numerics(v: dict[str, Any], con: Console) -> None:
    for n in v.get("numerics", []):
        fit = "fits" if n["fits"] else "still over"
        value = "true" if n["value"] is True else n["value"]
        kind = "numbers" if n["value"] is True else "kernel"
        con.print(f"   {kind} the study leaves unsaid: {n['field']}: {value} ({n['what']}) — "
                  f"{n['peak_mem_gib']:.1f} GiB peak, {fit}, tokens/s {n['gain']:+.1%}; a "
                  f"choice of {kind}, not searched")


def _verdict(doc: dict[str, Any], con: Console) -> None:
    v, step = doc["verdict"], doc["step"]
    parts = ", ".join(f"{k.replace('_', ' ')} {s / step['step_time_s']:.0%}"
                      for k, s in step["breakdown"].items() if s > 0)
    con.print(f"\n[bold]Verdict[/bold]: bound by [bold]{v['binding']}[/bold] — {v['reason']}.")
    con.print(f"   step: {parts}")
    _numerics(v, con)
    best = v["best_change"]
    if best is None or not v["improves"]:
        con.print(f"   best single change: {v['advice']} "
                  f"({v['neighbours_evaluated']} valid one-knob neighbours evaluated)")
        return
    adjusted = f" (adjusting {'; '.join(best['adjusted'])})" if best["adjusted"] else ""
    con.print(f"   best single change: [bold]{v['advice']}[/bold]{adjusted}; "
              f"{best['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, "
              f"{best['peak_mem_gib']:.1f} GiB peak — best of {v['neighbours_evaluated']} "
              f"valid one-knob neighbours")


def _markup_safe(value: Any) -> Any:
    """``value`` with every text in it escaped for rich's markup (``rich.markup.escape``): a study
    or model name such as ``[link=javascript:...]`` is then printed, not obeyed (in the report's
    HTML a link would be an ``<a href>`` rich does not escape)."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {_markup_safe(k): _markup_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_markup_safe(v) for v in value]
    return value


def render(raw: dict[str, Any], con: Console) -> None:
    """The explanation on ``con``. Its markup lines see only escaped text (``_markup_safe``);
    the lines printed as they are (``markup=False``) read the document itself."""
    doc = _markup_safe(raw)
    c = doc["cluster"]
    features = f" ({doc['model_features']})" if doc.get("model_features") else ""
    con.print(f"[bold]{doc['study']}[/bold]: {doc['model']}{features} on {c['num_gpus']}× "
              f"{c['gpu']}, seq {doc['training']['seq_len']}, batch "
              f"{doc['training']['global_batch']}")
    con.print(f"plan [bold]{doc['plan_text']}[/bold] ({doc['origin']})")
    if raw.get("calibration"):
        con.print(raw["calibration"]["line"], markup=False)
    if raw.get("uncertainty"):
        con.print("predicted " + interval_text({**raw["uncertainty"],
                                                "tokens_per_s_per_gpu":
                                                raw["step"]["tokens_per_s_per_gpu"]}),
                  markup=False)
    con.print()
    _memory(doc, con)
    _compute(doc, con)
    _communication(doc, con)
    _verdict(doc, con)
    if raw.get("baseline"):
        con.print("\n[bold]Baseline[/bold] (your current recipe beside this plan):")
        for line in raw["baseline"]["lines"]:
            con.print(f"   {line}", markup=False, soft_wrap=True)


def render_html(doc: dict[str, Any], width: int = 110) -> str:
    """The same text as an HTML ``<pre>`` fragment with inline colours."""
    con = Console(record=True, width=width, file=io.StringIO(), force_terminal=True,
                  highlight=False)
    render(doc, con)
    return con.export_html(inline_styles=True, code_format=(
        '<pre class="explain" style="font-family:monospace;font-size:12px;line-height:1.35">'
        "<code>{code}</code></pre>"))


def render_svg(doc: dict[str, Any], title: str = "tcf-search explain", width: int = 110) -> str:
    con = Console(record=True, width=width, file=io.StringIO(), force_terminal=True,
                  highlight=False)
    render(doc, con)
    return con.export_svg(title=title)
