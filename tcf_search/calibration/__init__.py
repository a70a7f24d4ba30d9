"""Calibration of the cost model, in one place: measured rows as batches (``dataset``), the fit on
``measured_runs.csv`` (``fit``, ``python -m tcf_search.calibration.fit``) and its accuracy figures
(``accuracy``), the ``predict`` command over a CSV of configurations, this machine measured as a
catalog entry (``device``, ``tcf-search calibrate``) and the refit from validation runs
(``refit``)."""
