"""The tcf-search commands, each in its own module or package, composed by ``cli``: ``explain``,
``compare``, ``export``, ``report``, ``nightly``, ``validate`` and ``calibration`` (``predict``,
``calibrate``, the fit on measured runs). They receive specs from ``search``; they never build
them."""
