"""The search: which plan trains fastest, memory first.

User text becomes cost-model inputs once (``specs``: a ``study``, a ``planfile``, a ``measured``
row, a ``presets`` name or an ``hf_config``) → ``space`` (valid layouts) → ``prune`` and
``placement`` (what fits, and CP-SAT's layer placement) → ``evaluate`` and ``optimize`` (Optuna)
→ ``output`` (through ``files``, the one atomic writer); ``pipeline.run_study`` composes them.
"""
