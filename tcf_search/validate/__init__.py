"""Validation of predicted plans with short real PyTorch runs, memory-only runs on fake tensors,
and calibration of the cost model from measurements.

torch is an optional extra (``pip install -e .[validate]``); importing this package does not
import it — the modules that need it import it inside their functions or are run as
subprocesses (``worker``, ``memory_only``, ``calibrate``).
"""
