"""What users hand the tool, read once and bounded: the study file (``study``, its ``sections``),
model ``presets`` and Hugging Face configs (``hf_config``), plan files and plan strings
(``planfile``, ``planspec``), measured-run rows (``measured``), all through one YAML loader
(``yamlinput``) and one reading and writing policy (``files``); ``specs`` resolves them into
cost-model inputs. Below the search: nothing here imports ``search``'s own modules.

The names the commands use are this package's face (``__all__``); the modules stay importable
for tests that reach inside one.
"""

from __future__ import annotations

from search.inputs.anchor_tails import (
    MAX_TAIL_WEIGHT,
    MIN_REGIME_GROUPS,
    MIN_TAIL_TO_BULK,
    Tail,
    cluster_share,
    regime_of,
    tails_from,
)
from search.inputs.files import (
    MIB,
    InputError,
    Output,
    OutputError,
    OutputExists,
    check_target,
    open_atomic,
    open_input,
    path_component,
    read_input,
    write_atomic,
)
from search.inputs.layout_transfer import (
    FEATURES,
    Transfer,
    distance,
    krige,
    layout_of,
    transfer_for,
)
from search.inputs.links import (
    CalibrationError,
    ClusterCalibration,
    MeasuredAnchor,
    anchor_matches,
    anchored,
    calibration_yaml,
    load_calibration,
    model_key,
)
from search.inputs.measured import KNOBS, Case, CaseError, case_from_row, presumed_split
from search.inputs.planfile import (
    MAX_PLAN_FILE_BYTES,
    PlanFile,
    PlanFileError,
    load_plan_file,
    plan_dict,
)
from search.inputs.planspec import (
    ALIASES,
    CHOICES,
    FALSE,
    PLAN_FIELDS,
    SHORT,
    TRUE,
    PlanSpecError,
    check,
    format_plan,
    make_plan,
    own_dispatch_unsaid,
    parse_assignments,
    parse_plan,
)
from search.inputs.presets import get_preset
from search.inputs.sections import LEVELS, MAX_GPUS
from search.inputs.specs import (
    LOSS_KERNELS,
    Specs,
    anchor_specs,
    build_specs,
    plan_file_specs,
    with_calibration,
)
from search.inputs.study import Study, StudyError, load_study
from search.inputs.yamlinput import YamlInputError, load_yaml, shown

__all__ = [
    "FEATURES", "Transfer", "distance", "krige", "layout_of", "transfer_for",
    "MAX_TAIL_WEIGHT", "MIN_REGIME_GROUPS", "MIN_TAIL_TO_BULK", "Tail", "cluster_share",
    "regime_of", "tails_from",
    "ALIASES", "CHOICES", "CalibrationError", "Case", "CaseError", "ClusterCalibration", "FALSE",
    "InputError", "KNOBS", "LEVELS", "LOSS_KERNELS", "MAX_GPUS", "MAX_PLAN_FILE_BYTES", "MIB",
    "MeasuredAnchor", "Output", "OutputError", "OutputExists", "PLAN_FIELDS", "PlanFile",
    "PlanFileError", "PlanSpecError", "SHORT", "Specs", "Study", "StudyError", "TRUE",
    "YamlInputError", "anchor_matches", "anchor_specs", "anchored", "build_specs",
    "calibration_yaml", "case_from_row", "check", "check_target", "format_plan", "get_preset",
    "load_calibration", "load_plan_file", "load_study", "load_yaml", "make_plan", "model_key",
    "open_atomic", "open_input", "own_dispatch_unsaid", "parse_assignments", "parse_plan",
    "path_component", "plan_dict", "plan_file_specs", "presumed_split", "read_input", "shown",
    "with_calibration", "write_atomic",
]
