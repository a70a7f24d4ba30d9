"""From a result folder to ``report.html`` (and PNGs): load, draw, explain, write."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from search.files import Output, OutputError
from search.output import run_file
from tcf_search.report.data import ReportError, load_result, with_baseline
from tcf_search.report.markup import Html, fragment


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportFiles:
    html: Path
    pngs: list[Path] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cost_model: str | None = None  # the version that ranked the result, as result.json has it

    def to_dict(self) -> dict[str, object]:
        return {"html": str(self.html), "pngs": [str(p) for p in self.pngs],
                "figures": list(self.figures), "notes": list(self.notes),
                "cost_model": self.cost_model}


def _explain_best(folder: Path, study: Path | None) -> tuple[Html | None, str | None]:
    """The explain text of the best plan as HTML, or why there is none."""
    from tcf_search.explain.analysis import explain
    from tcf_search.explain.render import render_html
    from tcf_search.explain.source import resolve

    if not (folder / "best_plan.yaml").is_file():
        return None, None
    try:
        subject = (resolve(study, None, 1, folder) if study is not None
                   else resolve(folder, None, None))
        return fragment(render_html(explain(subject))), None
    except ValueError as exc:
        return None, f"explain of the best plan unavailable: {exc}"


def _baseline(folder: Path, study_path: Path | None, flag: str) -> dict[str, Any]:
    """``--baseline`` judged on the study (its space too) or, without one, on the specs the
    best plan's file records; set beside the best plan."""
    from search.baseline import baseline_doc, baseline_of
    from search.planfile import load_plan_file
    from search.space import build_space
    from search.specs import build_specs, plan_file_specs
    from search.study import load_study

    best_path = folder / "best_plan.yaml"
    best = load_plan_file(best_path) if best_path.is_file() else None
    if study_path is not None:
        study = load_study(study_path)
        specs = build_specs(study)
        found = baseline_of(None, specs, flag)
        assert found is not None
        return baseline_doc(specs, *found, space=build_space(study, specs),
                            best=best.plan if best else None)
    if best is None:
        raise ReportError(f"--baseline: {best_path} is missing; give the study with --study")
    specs = plan_file_specs(best)
    found = baseline_of(None, specs, flag)
    assert found is not None
    return baseline_doc(specs, *found, best=best.plan)


def _not_the_runs(path: Path) -> Path:
    """``path``, unless it is one of a run's result files: no report replaces one, with or
    without ``--force`` (that is for files no tcf-search command keeps)."""
    if run_file(path):
        raise OutputError(f"refusing to replace {path}: it is a file of the run's result, "
                          f"which no report replaces (--force or not); write the report "
                          f"elsewhere, e.g. -o {path.parent / 'report.html'}")
    return path


def build_report(folder: Path, out_html: Path, png_dir: Path | None = None,
                 study: Path | None = None, *, force: bool = False,
                 baseline: str | None = None) -> ReportFiles:
    """Write the report by the output policy of :class:`search.files.Output`: the HTML file
    and the PNGs replace only files a report wrote (anything else needs ``force``), all
    checked before the first write."""
    try:
        from tcf_search.report import plots
    except ImportError as exc:  # matplotlib is the ``report`` extra
        raise ReportError(f"report needs matplotlib: pip install 'tcf-search[report]' "
                          f"({exc})") from None
    from tcf_search.report.html import page

    html_out = Output(out_html.parent, "report", force=force)
    html_out.check([_not_the_runs(html_out.path(out_html.name))])
    png_out = Output(png_dir, "report", force=force) if png_dir is not None else None
    data = load_result(folder)
    if baseline is not None:
        data = with_baseline(data, _baseline(folder, study, baseline))
    figures: dict[str, bytes] = {}
    for name, draw in plots.FIGURES:
        fig = draw(data)
        if fig is not None:
            figures[name] = plots.png_bytes(fig)
    pngs = {f"{name}.png": png for name, png in figures.items()}
    if png_out is not None:
        png_out.check([_not_the_runs(png_out.path(name)) for name in pngs])
    from tcf_search.explain.source import ranking_note

    explain_html, note = _explain_best(folder, study)
    # the explain section and a --baseline are judged now; the ranking was by the run's model
    notes = [n for n in (ranking_note(folder), note) if n]
    written = png_out.write_many(pngs) if png_out is not None else []
    html_out.write(out_html.name, page(data, figures, explain_html, notes))
    return ReportFiles(html=out_html, pngs=written, figures=list(figures), notes=notes,
                       cost_model=data.cost_model)
