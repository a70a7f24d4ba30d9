"""One self-contained HTML page: figures as inline PNG data, inline CSS, no script, nothing
fetched."""

from __future__ import annotations

import html
from typing import Any

from search.output import ranking_line
from tcf_search.report.data import ResultData

CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#666;font-size:13px} table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right} th{background:#f6f6f6}
td.l,th.l{text-align:left} figure{margin:12px 0} figure img{max-width:100%;height:auto}
figcaption{font-size:12px;color:#555} .note{background:#fff6e0;padding:6px 10px;font-size:13px}
pre.explain{background:#fafafa;border:1px solid #eee;padding:10px;overflow-x:auto}
"""

CAPTIONS = {
    "memory": "Per-GPU memory of the top plans on their peak pipeline stage, by component, "
              "against usable HBM (memory is the hard constraint).",
    "step_time": "Step time of the top plans: compute kernels (with recompute), communication "
                 "not hidden under compute, the pipeline bubble and the optimizer.",
    "throughput_vs_memory": "Every completed trial: predicted tokens/s per GPU against peak "
                            "memory, with the Pareto front of the two.",
    "convergence": "The objective of each trial and the best found so far.",
    "layout_heatmap": "Feasible layouts over (tp, pp), coloured by the best tokens/s a trial "
                      "found there; grey cells had no layout left, labelled by the constraint "
                      "that removed them.",
}


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _top_table(data: ResultData) -> str:
    cols = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage", "micro_batch", "recompute",
            "sequence_parallel")
    head = "".join(f"<th>{c.replace('_', ' ')}</th>" for c in ("#", *cols))
    head += ("<th>tok/s/GPU</th><th>80% interval</th><th>P(OOM)</th><th>MFU</th><th>step s</th>"
             "<th>mem GiB</th><th class=l>bound by</th>")
    rows = []
    for r in data.top:
        p, m = r["plan"], r["predicted"]
        cells = "".join(f"<td>{_esc(p[c])}</td>" for c in cols)
        lo_hi = m.get("tokens_per_s_interval")
        band = f"{lo_hi[0]:,.0f}–{lo_hi[1]:,.0f}" if lo_hi else ""
        p_oom = f"{m['p_oom']:.0%}" if "p_oom" in m else ""
        rows.append(f"<tr><td>{r['rank']}</td>{cells}<td>{m['tokens_per_s_per_gpu']:,.0f}</td>"
                    f"<td>{band}</td><td>{p_oom}</td><td>{m['mfu']:.1%}</td><td>{m['step_time_s']:.2f}</td>"
                    f"<td>{m['peak_mem_gib']:.1f}/{m['usable_mem_gib']:.1f}</td>"
                    f"<td class=l>{_esc(m['dominant_challenge'])}</td></tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


BASELINE_ROWS = (("tokens/s per GPU", "tokens_per_s_per_gpu", "{:,.0f}"),
                 ("step s", "step_time_s", "{:.2f}"), ("MFU", "mfu", "{:.1%}"),
                 ("compute challenge s (kernels, bubble, optimizer)", "compute_challenge_s",
                  "{:.2f}"), ("recomputation s", "recompute_s", "{:.2f}"),
                 ("bubble share", "bubble_share", "{:.0%}"),
                 ("exposed communication s", "exposed_comm_s", "{:.2f}"),
                 ("peak memory GiB", "peak_mem_gib", "{:.1f}"),
                 ("headroom GiB", "headroom_gib", "{:.1f}"))


def _baseline_table(data: ResultData) -> str:
    b = data.baseline
    assert b is not None
    v = b.get("versus")
    head = (f"<tr><th class=l></th><th>baseline {_esc(b['plan_text'])}</th>"
            + (f"<th>{_esc(v['label'])} {_esc(v['plan_text'])}</th>" if v else "") + "</tr>")
    rows = [f"<tr><td class=l>{label}</td><td>{fmt.format(b['figures'][key])}</td>"
            + (f"<td>{fmt.format(v['figures'][key])}</td>" if v else "") + "</tr>"
            for label, key, fmt in BASELINE_ROWS]
    fits = "yes" if b["figures"]["fits"] else "no (memory is a hard constraint)"
    rows.append(f"<tr><td class=l>fits</td><td>{fits}</td>"
                + ("<td>yes</td>" if v and v["figures"]["fits"] else "<td></td>" if v else "")
                + "</tr>")
    return f"<table id=baseline>{head}{''.join(rows)}</table>"


def _ranked_by(data: ResultData) -> str:
    version = data.cost_model
    if version is None:
        return ("ranked by a cost model the result does not record (written before tcf-search "
                "recorded it)")
    return f"ranked by cost model {version[:12]}"


def page(data: ResultData, figures: dict[str, str], explain_html: str | None,
         notes: list[str]) -> str:
    r = data.result
    c = r["cluster"]
    pruned = ", ".join(f"{_esc(k)} {v:,}" for k, v in r.get("pruned_by", {}).items() if v)
    parts = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        f"<title>tcf-search report: {_esc(r['study'])}</title><style>{CSS}</style></head><body>",
        f"<h1>{_esc(r['study'])}</h1>",
        f"<div class=sub>{_esc(r['model'])} on {c['num_gpus']}× {_esc(c['gpu'])} — "
        f"{r['space_size']:,} layouts, {r['valid_count']:,} valid, {r['feasible_count']:,} fit "
        f"in memory; {r['trials']} trials; objective {_esc(r['objective']['metric'])} "
        f"({_esc(r['objective']['direction'])})</div>",
        f"<div class=sub>pruned: {pruned or 'nothing'}</div>",
    ]
    if r.get("calibration"):
        parts.append(f"<div class=sub>{_esc(r['calibration']['line'])}</div>")
    parts.append(f"<div class=sub id=cost-model>{_esc(_ranked_by(data))}</div>")
    parts += [f"<p class=note>{_esc(n)}</p>" for n in [*r.get("notes", []), *notes]]
    if data.top:
        parts += ["<h2>Top plans</h2>", _top_table(data)]
        if line := ranking_line(r.get("ranking") or {}):
            parts.append(f"<p class=sub id=ranking>{_esc(line)}</p>")
    else:
        misses = "".join(f"<li>{_esc(m.get('reason', m))}</li>" for m in r.get("near_misses", []))
        parts += ["<h2>No layout fits</h2>", f"<ul>{misses}</ul>"]
    if data.baseline is not None:
        parts += ["<h2>Baseline: your current recipe beside the best</h2>",
                  _baseline_table(data),
                  *(f"<p class=sub>{_esc(line.strip())}</p>" for line in data.baseline["lines"])]
    if explain_html:
        parts += ["<h2>Why the best plan is fast: memory, compute, communication</h2>",
                  explain_html]
    for name, img in figures.items():
        parts.append(f"<h2>{_esc(name.replace('_', ' ').capitalize())}</h2><figure id={name}>"
                     f"{img}<figcaption>{_esc(CAPTIONS.get(name, ''))}</figcaption></figure>")
    parts.append(f"<p class=sub>result folder: {_esc(data.folder)}</p></body></html>")
    return "\n".join(parts)
