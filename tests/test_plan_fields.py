"""The table of plan fields (costmodel/plan_fields.py) is the one declaration of a plan field:
every reader and writer of a plan covers exactly its rows (the dataclass, the columns, the rules,
the plan string, the plan file, trials.csv, the measured-runs CSV reader, the search, the launch
view, predict's choices), and every field survives plan string -> Plan -> plan file -> CSV row ->
arrays and back. A row added to the table and missed by a consumer fails here, naming it."""

from __future__ import annotations

import csv
import dataclasses
import io
import re
import typing
from pathlib import Path

import optuna
import pytest

from costmodel import PLAN_FIELDS, Plan, SpecError, plans_to_arrays, rules
from costmodel.plan_fields import FIELDS, PLAN_KEYS, PlanField
from costmodel.plans import PlanArrays, as_plan_arrays
from costmodel.recompute_modules import MODELLED, module_mask
from search.evaluate import PLACED
from search.inputs.measured import KNOBS, row_plan
from search.inputs.planfile import dump_plan_file, load_plan_file, parse_plan_file, plan_dict
from search.inputs.planspec import (
    ALIASES,
    CHOICES,
    SHORT,
    format_plan,
    make_plan,
    parse_assignments,
)
from search.inputs.sections import SearchSpaceSection
from search.optimize import plan_cells, trial_rows
from search.output import trials_csv
from search.space import AXES, plan_from_row
from tcf_search.calibration.predict import CHOICE_COLUMNS
from tcf_search.export import ExportOptions
from tcf_search.export.view import LaunchView, facts_of

GOLDEN_PLAN = Path(__file__).parent / "golden" / "export" / "plans" / "dense70b.yaml"
LAYERS = 80  # the golden plan file's model
# Plans that between them move every field off its default, each canonical (interleaved iff
# vpp > 1) and a set of modules in MODELLED order, as the columns give them back.
PLANS = {
    "pipeline": Plan(tp=2, pp=4, dp=3, cp=2, ep=2, vpp=2, zero_stage=1, micro_batch=2,
                     recompute="full", recompute_layers=2, sequence_parallel=True,
                     pp_schedule="interleaved", first_stage_layers=18, last_stage_layers=22,
                     expert_tp=1, moe_dispatcher="flex", moe_a2a_overlap="on"),
    "modules": Plan(pp=2, dp=4, zero_stage=3, recompute="selective",
                    recompute_modules=("core_attn", "mlp"), pp_schedule="gpipe"),
    "offload": Plan(dp=8, micro_batch=4, cpu_offload_layers=2),
}


def test_the_plans_move_every_field() -> None:
    moved = {f.name for f in PLAN_FIELDS for p in PLANS.values()
             if getattr(p, f.name) != f.default}
    assert moved == set(PLAN_KEYS)


def test_the_table_is_well_formed() -> None:
    assert len(FIELDS) == len(PLAN_FIELDS)
    keys = [f.key for f in PLAN_FIELDS]
    assert len(set(keys)) == len(keys)
    # a short key never names another field
    assert not {f.key for f in PLAN_FIELDS if f.key != f.name} & set(PLAN_KEYS)
    for f in PLAN_FIELDS:
        assert f.doc and f.type in (int, bool, str, tuple), f.name
        assert isinstance(f.default, f.type), f.name
        assert f.type not in (str, tuple) or f.choices, f.name
        assert f.type is not str or f.default in f.choices, f.name


def test_plan_declares_the_rows_in_order_with_their_types_and_defaults() -> None:
    hints = typing.get_type_hints(Plan)
    fields = dataclasses.fields(Plan)
    assert [x.name for x in fields] == list(PLAN_KEYS)
    for x in fields:
        f = FIELDS[x.name]
        assert x.default == f.default, x.name
        hint = hints[x.name]
        if f.type is str:
            assert typing.get_origin(hint) is typing.Literal, x.name
            assert typing.get_args(hint) == f.choices, x.name
        elif f.type is tuple:
            assert hint == tuple[str, ...], x.name
        else:
            assert hint is f.type, x.name


def test_help_shows_each_fields_meaning() -> None:
    assert all(f"{f.name} [{f.key}]: {f.doc}" in (Plan.__doc__ or "") for f in PLAN_FIELDS)


@pytest.mark.parametrize("f", PLAN_FIELDS, ids=lambda f: f.name)
def test_codes_are_the_columns_encoding(f: PlanField) -> None:
    assert f.value(f.code(f.default)) == f.default
    for value in f.choices if f.type is str else ():
        assert f.value(f.code(value)) == value
    if f.type is tuple:
        assert f.choices == MODELLED
        assert f.code(("mlp", "core_attn")) == module_mask(("mlp", "core_attn"))
        assert f.value(f.code(("mlp", "core_attn"))) == ("core_attn", "mlp")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("tp", 0, "plan.tp must be a number in (0, 1e30)"),
    ("zero_stage", 4, "plan.zero_stage must be 0, 1, 2 or 3, but got 4"),
    ("recompute", "most", "plan.recompute must be one of ['full', 'none', 'selective']"),
    ("pp_schedule", "zb", "plan.pp_schedule must be one of ['1f1b', 'gpipe', 'interleaved']"),
    ("cpu_offload_layers", -1, "plan.cpu_offload_layers must be an integer in [0, 2**53)"),
    ("first_stage_layers", True, "plan.first_stage_layers must be an integer in [0, 2**53)"),
])
def test_each_fields_rule_comes_from_its_row(field: str, value: object, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        Plan(**{field: value})  # type: ignore[arg-type]


# ---- every consumer covers exactly the table's rows -----------------------------------------

def test_plan_arrays_hold_a_column_per_row() -> None:
    assert [x.name for x in dataclasses.fields(PlanArrays)] == list(PLAN_KEYS)
    assert list(plans_to_arrays(list(PLANS.values()))) == list(PLAN_KEYS)
    arrays = as_plan_arrays({"tp": [2], "pp": [1], "dp": [4], "micro_batch": [1]})
    assert {k: int(getattr(arrays, k)[0]) for k in PLAN_KEYS} == {
        **{f.name: f.code(f.default) for f in PLAN_FIELDS}, "tp": 2, "dp": 4}


def test_the_rules_read_every_field() -> None:
    assert rules.PLAN_COLUMNS == PLAN_KEYS
    for plan in PLANS.values():
        cols = rules.plan_columns(plan)
        assert list(cols) == list(PLAN_KEYS)
        assert rules.plan_columns(dataclasses.asdict(plan)) == cols  # the mapping form
        assert rules.plan_columns({}) == rules.plan_columns(Plan())  # absent: the defaults


def test_the_plan_string_has_a_key_per_row() -> None:
    assert sorted(name for name, _ in SHORT) == sorted(PLAN_KEYS)
    assert dict(SHORT) == {f.name: f.key for f in PLAN_FIELDS}
    assert ALIASES == {f.key: f.name for f in PLAN_FIELDS if f.key != f.name}
    assert CHOICES == {f.name: f.choices for f in PLAN_FIELDS if f.type is str}
    always = {f.name for f in PLAN_FIELDS if f.always_shown}
    assert format_plan(Plan()) == ",".join(f"{k}={getattr(Plan(), n)}" for n, k in SHORT
                                           if n in always)


def test_the_plan_file_writes_every_field() -> None:
    for plan in PLANS.values():
        # a set of names, or a MoE dispatch, only where the plan names its own (the
        # training's otherwise)
        assert list(plan_dict(plan)) == [f.name for f in PLAN_FIELDS
                                         if (f.type is not tuple and "" not in f.choices)
                                         or getattr(plan, f.name)]


def test_trials_csv_has_a_column_per_row() -> None:
    study = optuna.create_study()
    for plan in PLANS.values():
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs={"plan": plan_dict(plan)}))
    header = next(csv.reader(io.StringIO(trials_csv(trial_rows(study)))))
    assert header[header.index("value_0") + 1:][:len(PLAN_KEYS)] == list(PLAN_KEYS)
    assert list(plan_cells({})) == list(PLAN_KEYS)  # a trial without a plan: empty cells


def test_the_csv_reader_reads_a_column_per_row() -> None:
    row = {"tp": "2", "pp": "4", "dp": "3"}
    plan = row_plan(row, LAYERS)
    assert plan == Plan(tp=2, pp=4, dp=3, sequence_parallel=True)  # SP on by default at tp > 1
    assert set(KNOBS) <= set(PLAN_KEYS)
    assert CHOICE_COLUMNS == tuple(f"pred_choice_{k}" for k in KNOBS)


def test_the_search_decides_every_field() -> None:
    """A field is a searched axis (a knob of search_space) or placed by the CP-SAT stage."""
    assert sorted((*AXES, *PLACED)) == sorted(PLAN_KEYS)
    assert set(AXES) <= set(SearchSpaceSection.model_fields)


def test_the_launch_view_names_every_field() -> None:
    names = {x.name for x in dataclasses.fields(LaunchView)}
    assert {f.export for f in PLAN_FIELDS} <= names
    pf = dataclasses.replace(load_plan_file(GOLDEN_PLAN), plan=PLANS["pipeline"])
    view = facts_of(pf, ExportOptions(), "megatron")
    straight = ("tp", "pp", "dp", "cp", "ep", "vpp", "zero_stage", "micro_batch", "recompute",
                "recompute_layers", "sequence_parallel", "pp_schedule", "first_stage_layers",
                "last_stage_layers", "expert_tp", "cpu_offload_layers")
    for name in straight:  # the rest are resolved (a launcher's module set, the training's)
        assert getattr(view, FIELDS[name].export) == getattr(pf.plan, name), name


# ---- every field round-trips through every format --------------------------------------------

@pytest.mark.parametrize("name", PLANS)
def test_every_field_round_trips(name: str) -> None:
    plan = PLANS[name]
    # plan string -> Plan
    text = format_plan(plan)
    assert make_plan(parse_assignments(text)) == plan
    # Plan -> plan file -> Plan
    pf = dataclasses.replace(load_plan_file(GOLDEN_PLAN), plan=plan)
    assert parse_plan_file(dump_plan_file(pf)).plan == plan
    # Plan -> trials.csv row -> the CSV reader -> Plan
    cells = next(csv.DictReader(io.StringIO(trials_csv([plan_cells(plan_dict(plan))]))))
    assert row_plan(cells, LAYERS) == plan
    # Plan -> arrays -> Plan
    columns = plans_to_arrays([plan])
    assert plan_from_row({k: int(v[0]) for k, v in columns.items()}) == plan
    # the fields' own names read as their short keys do
    items = (item.partition("=") for item in text.split(","))
    assert make_plan(parse_assignments(",".join(f"{ALIASES.get(k, k)}={v}"
                                                 for k, _, v in items))) == plan
