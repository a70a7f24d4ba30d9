"""``tcf-search report RESULT -o report.html``: one offline HTML page and static PNGs."""

from tcf_search.report.build import ReportFiles, build_report
from tcf_search.report.cli import report_cmd
from tcf_search.report.data import ReportError, load_result

__all__ = ["ReportError", "ReportFiles", "build_report", "load_result", "report_cmd"]
