"""The search: which plan trains fastest, memory first.

``study`` (the YAML schema) → ``space`` (valid layouts) → ``prune`` and ``placement`` (what fits,
and CP-SAT's layer placement) → ``evaluate`` and ``optimize`` (Optuna) → ``output``;
``pipeline.run_study`` composes them.
"""
