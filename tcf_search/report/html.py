"""One self-contained HTML page: figures as inline PNG data, inline CSS, no script, nothing
fetched. Every value reaches the page through :func:`tcf_search.report.markup.html`, escaped."""

from __future__ import annotations

import base64

from search import prior_legend, ranking_line
from tcf_search.report.data import ResultData
from tcf_search.report.markup import Html, html, join
from tcf_search.report.schema import Figures

CSS = Html("""
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1100px;
color:#222;padding:0 16px}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
.sub{color:#666;font-size:13px} table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{padding:3px 5px;border-bottom:1px solid #eee;text-align:right} th{background:#f6f6f6}
td.l,th.l{text-align:left} figure{margin:12px 0} figure img{max-width:100%;height:auto}
figcaption{font-size:12px;color:#555} .note{background:#fff6e0;padding:6px 10px;font-size:13px}
pre.explain{background:#fafafa;border:1px solid #eee;padding:10px;overflow-x:auto}
table{max-width:100%} td.plan{text-align:left;overflow-wrap:anywhere;max-width:420px}
""")

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


TOP_COLUMNS = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage", "micro_batch", "recompute",
               "sequence_parallel")
TOP_HEAD = Html("<th>tok/s/GPU</th><th>80% interval</th><th>P(OOM)</th><th>MFU</th>"
                "<th>step s</th><th>mem GiB</th><th class=l>bound by</th>"
                "<th class=l>net</th>")


def _top_table(data: ResultData) -> Html:
    head = join(html("<th>{}</th>", c.replace("_", " ")) for c in ("#", *TOP_COLUMNS))
    rows = []
    for r in data.top:
        p, m = r.plan, r.predicted
        cells = join(html("<td>{}</td>", str(getattr(p, c))) for c in TOP_COLUMNS)
        lo_hi = m.tokens_per_s_interval
        marks = "".join(t.mark or "?" for t in m.interval_rests_on)
        flags = f" †{marks}" if marks else ""
        band = html("{:,.0f}–{:,.0f}{}", *lo_hi, flags) if lo_hi else ""
        p_oom = html("{:.0%}", m.p_oom) if m.p_oom is not None else ""
        rows.append(html("<tr><td>{}</td>{}<td>{:,.0f}</td><td>{}</td><td>{}</td><td>{:.1%}</td>"
                         "<td>{:.2f}</td><td>{:.1f}/{:.1f}</td><td class=l>{}</td>"
                         "<td class=l>{}</td></tr>",
                         r.rank, cells, m.tokens_per_s_per_gpu, band, p_oom, m.mfu,
                         m.step_time_s, m.peak_mem_gib, m.usable_mem_gib,
                         m.dominant_challenge, m.network_groups.replace(",", ", ") or "-"))
    return html("<table><tr>{}{}</tr>{}</table>", head, TOP_HEAD, join(rows))


BASELINE_ROWS = (("tokens/s per GPU", "tokens_per_s_per_gpu", "{:,.0f}"),
                 ("step s", "step_time_s", "{:.2f}"), ("MFU", "mfu", "{:.1%}"),
                 ("compute challenge s (kernels, bubble, optimizer)", "compute_challenge_s",
                  "{:.2f}"), ("recomputation s", "recompute_s", "{:.2f}"),
                 ("bubble share", "bubble_share", "{:.0%}"),
                 ("exposed communication s", "exposed_comm_s", "{:.2f}"),
                 ("peak memory GiB", "peak_mem_gib", "{:.1f}"),
                 ("headroom GiB", "headroom_gib", "{:.1f}"))


def _figure(figures: Figures, key: str, fmt: str) -> str:
    """One figure's number as text (escaped where the page takes it)."""
    return fmt.format(getattr(figures, key))


def _baseline_table(data: ResultData) -> Html:
    b = data.baseline
    assert b is not None
    v = b.versus
    # short headers, the plans in a row of their own that wraps: a plan string as a column
    # header set the table wider than the page (issue #38)
    head = html("<tr><th class=l></th><th>baseline</th>{}</tr>",
                html("<th>{}</th>", v.label) if v else "")
    rows = [html("<tr><td class=l>plan</td><td class=plan>{}</td>{}</tr>", b.plan_text,
                 html("<td class=plan>{}</td>", v.plan_text) if v else "")]
    rows += [html("<tr><td class=l>{}</td><td>{}</td>{}</tr>", label,
                 _figure(b.figures, key, fmt),
                 html("<td>{}</td>", _figure(v.figures, key, fmt)) if v else "")
            for label, key, fmt in BASELINE_ROWS]
    fits = "yes" if b.figures.fits else "no (memory is a hard constraint)"
    versus_fits = ("" if v is None else "yes" if v.figures.fits else "")
    rows.append(html("<tr><td class=l>fits</td><td>{}</td>{}</tr>", fits,
                     html("<td>{}</td>", versus_fits) if v else ""))
    return html("<table id=baseline>{}{}</table>", head, join(rows))


def _ranked_by(data: ResultData) -> str:
    version = data.cost_model
    if version is None:
        return ("ranked by a cost model the result does not record (written before tcf-search "
                "recorded it)")
    return f"ranked by cost model {version[:12]}"


def _figure_tag(name: str, png: bytes) -> Html:
    return html('<h2>{}</h2><figure id="{}"><img alt="{}" src="data:image/png;base64,{}">'
                "<figcaption>{}</figcaption></figure>",
                name.replace("_", " ").capitalize(), name, name.replace("_", " "),
                base64.b64encode(png).decode("ascii"), CAPTIONS.get(name, ""))


def page(data: ResultData, figures: dict[str, bytes], explain_html: Html | None,
         notes: list[str]) -> Html:
    """The page: ``figures`` are PNG bytes by name, ``explain_html`` the explain section."""
    r = data.result
    c = r.cluster
    pruned = ", ".join(f"{k} {v:,}" for k, v in r.pruned_by.items() if v)
    parts = [
        html("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
             "<title>tcf-search report: {}</title><style>{}</style></head><body>", r.study, CSS),
        html("<h1>{}</h1>", r.study),
        html("<div class=sub>{} on {}× {} — {:,} layouts, {:,} valid, {:,} fit in memory; "
             "{:,} trials; objective {} ({})</div>", r.model, c.num_gpus, c.gpu, r.space_size,
             r.valid_count, r.feasible_count, r.trials, r.objective.metric,
             r.objective.direction),
        html("<div class=sub>pruned: {}</div>", pruned or "nothing"),
    ]
    if r.calibration.line is not None:
        parts.append(html("<div class=sub>{}</div>", r.calibration.line))
    parts.append(html("<div class=sub id=cost-model>{}</div>", _ranked_by(data)))
    parts += [html("<p class=note>{}</p>", n) for n in [*r.notes, *notes]]
    if data.top:
        parts += [html("<h2>Top plans</h2>"), _top_table(data)]
        parts += [html("<p class=sub>{}</p>", line)
                  for line in prior_legend(r.predicted.model_dump() for r in data.top)]
        if line := ranking_line(r.ranking.model_dump()):
            parts.append(html("<p class=sub id=ranking>{}</p>", line))
    else:
        misses = join(html("<li>{}</li>", m.reason) for m in r.near_misses)
        parts += [html("<h2>No layout fits</h2>"), html("<ul>{}</ul>", misses)]
    if data.baseline is not None:
        parts += [html("<h2>Baseline: your current recipe beside the best</h2>"),
                  _baseline_table(data),
                  *(html("<p class=sub>{}</p>", line.strip()) for line in data.baseline.lines)]
    if explain_html:
        parts += [html("<h2>Why the best plan is fast: memory, compute, communication</h2>"),
                  explain_html]
    parts += [_figure_tag(name, png) for name, png in figures.items()]
    parts.append(html("<p class=sub>result folder: {}</p></body></html>", str(data.folder)))
    return join(parts, "\n")
