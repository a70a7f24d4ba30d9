"""Calibrate the cost model on measured runs, honestly: few physical parameters, a held-out split.

Run ``python -m tcf_search.calibration.fit [--csv PATH] [--write]``. It fits

* per SKU family (here: hopper on the Playbook's H100 runs and llm-foundry's single-node ones;
  ampere on a part of llm-foundry's A100 runs and Megatron SC21's), each source's rows weighing
  as much together as another's: GEMM peak fraction and half-size, attention peak fraction,
  memory-bound bandwidth fraction, host (kernel issue) overhead, NVLink and network
  bus-bandwidth fractions;
* the memory model of the software stack: activation factor, logits bytes per element,
  allocator fragmentation fraction and constant (Playbook ok runs' ``max_memory_reserved``);
  and for each stack whose runs report no memory, the most fragmentation its launched runs
  leave room for (``memory_fit.launched_bounds``: Megatron-Core's, llm-foundry's);

on the rows whose sweep group (model, GPU count) is *not* held out, and prints the accuracy on
the held-out groups and on every row. ``--write`` writes ``hardware_catalog/calibration.yaml``
(and fabrics.yaml, the fitted lines of frameworks.yaml, and uncertainty.yaml: bounds from the
held-out residuals per regime, of the calibration as written, by ``tcf_search.calibration.
uncertainty`` in a fresh interpreter, so that they are the shipped model's to the last digit).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import yaml

from costmodel.specs import Efficiency
from hardware_catalog import (
    CATALOG_DIR,
    FAMILIES,
    get_fabric,
    get_gpu,
    load_calibration,
)
from hardware_catalog.catalog import REFERENCE_SKUS
from tcf_search.calibration.accuracy import regime, report, throughput_rows
from tcf_search.calibration.dataset import (
    Group,
    find_measured_csv,
    load_groups,
    predict_groups,
    split_mask,
    with_training,
)
from tcf_search.calibration.least_squares import (
    EFF_PARAMS,
    FABRIC_PREFIX,
    FABRIC_STEP_PREFIX,
    TRAINING_PARAMS,
    fabric_values,
    fit_efficiency,
    with_fabrics,
)
from tcf_search.calibration.memory_fit import (
    FRAMEWORK_MEM_PARAMS,
    covered,
    fit_memory,
    fit_pressure,
    launched_bounds,
    nanotron_memory,
)
from tcf_search.calibration.moe_fit import fit_moe, report_moe
from tcf_search.calibration.uncertainty import coverage
from tcf_search.calibration.writing import (
    allocator_model,
    stack_fractions,
    write_calibration,
    write_efficiencies,
)

# The Playbook runs cannot tell GEMM from attention efficiency apart (one sequence length
# dominates): their fit starts from this prior (public cuBLAS measurements: large bf16 GEMMs
# reach about 70% of the dense peak on H100 and A100); the GEMM fraction itself is then fitted
# on NVIDIA's DGX Cloud tables (NeMo: wide GEMMs, sequences 2k-8k) and the Playbook refitted.
GEMM_PRIOR = {"gemm_peak_fraction": 0.70, "gemm_half_size": 128.0}
# fitted on the dgxc-benchmarking H100 dense rows
DGXC_PARAMS = ("gemm_peak_fraction", "flash3_attention_peak_fraction", "fp8_gemm_peak_fraction",
               "fp8_cast_bytes_per_element")
# Blackwell's GEMM fractions (bf16 and fp8) are fitted on the GB200 dense rows of NVIDIA's
# tables (Llama 3.1 405B, bf16 and fp8, 128-512 GPUs: two configurations at three scales, so two
# parameters); its attention, memory-bound, cast and link terms are hopper's (the rows cannot
# tell them apart). The GB200 Grok-1 rows of the same release (MoE) disagree: with these
# fractions they come out 12-18% slow (at the expert TP 4 they ran), while the dense rows fit
# within 1%; their predicted kernels alone outlast the measured step, so one side misses a
# term; the dense rows identify the GEMMs.
BLACKWELL_PARAMS = ("gemm_peak_fraction", "fp8_gemm_peak_fraction")
# FlashAttention-2 on A100: Dao (2023), "FlashAttention-2", arXiv 2307.08691, abstract: 50-73%
# of the theoretical maximum FLOPs/s (FlashAttention-1: 25-40%); the low end, as training runs
# the backward too, which reaches less than the forward
FA2_A100_PRIOR = 0.50
# compute-communication contention is a prior, not fitted (fitted on the dgxc rows it runs to
# its bound and drags the GEMM fractions to 0.86 / 0.95): NCCL's 16 channels (one CTA, one SM
# each) on an 8-GPU NVSwitch node over the SMs of the SKU the family's rows ran on (the catalog's
# sm_count: A100 108, H100 SXM5 132, each from its whitepaper)
NCCL_CHANNELS = 16.0
# the fit's start for the network ring step: NCCL's tuning table (src/graph/tuning.cc hwLat, NET
# Ring/Simple), the GPUs' catalog prior
NCCL_NET_STEP_S = 14e-6
# Fabrics whose network fraction is a cited prior in fabrics.yaml, not fitted: the only rows on
# InfiniBand are Megatron SC21's (Selene): halving the fraction lengthens their steps by only
# 0.6-3.7%, so they cannot identify it (fitted, it ran to its bound of 1.0 on the small SC21
# models' unrelated 5-12% shortfall). The prior is NCCL's measured inter-node all-reduce bus
# bandwidth over the NIC's line rate (fabrics.yaml gives the figures and where NVIDIA's NCCL
# engineers state them).
PRIOR_FABRICS = ("infiniband",)
# The Playbook's cluster's fabric (search.inputs.measured.SOURCE_FABRICS: AWS EFA): its network
# fraction and ring step are fitted on the Playbook's runs as that fabric's (fabrics.yaml), and
# every family prices a cluster that names no fabric as that measured one (network_fabric).
MEASURED_FABRIC = "efa"
PLAYBOOK_PARAMS = (*(p for p in EFF_PARAMS
                     if p not in ("network_bw_fraction", "network_step_latency_s")),
                   FABRIC_PREFIX + MEASURED_FABRIC, FABRIC_STEP_PREFIX + MEASURED_FABRIC,
                   *TRAINING_PARAMS)
# Not fitted either: the network point-to-point fraction (Efficiency.p2p_network_bw_fraction, a
# cited prior of NCCL's per-NIC peer bandwidth): fitted free on the Playbook with nanotron's
# placement on (frameworks.yaml pp_cost_balance) it ran to its bound of 1.0 (issue 17).


def fit_ampere(frame: pd.DataFrame, groups: list[Group], train: pd.Series, hopper: Efficiency,
               ) -> tuple[Efficiency, dict[str, float], dict[str, int]]:
    """A100: llm-foundry's FSDP runs (flash attention, RoCE) and Megatron SC21's (GEMM-bound:
    wide layers, full recompute, HDR InfiniBand) together tell GEMM, attention and memory-bound
    efficiency apart, and the two fabrics' network fractions. Returns the family's efficiency,
    the fitted fabrics' fractions (not PRIOR_FABRICS') and how many fitted rows ran on each."""
    a100 = ((frame["source"].eq("llm-foundry") & frame["gpu"].str.startswith("a100"))
            | frame["source"].eq("megatron-sc21")) & frame["status"].eq("ok") & train
    sms = get_gpu(REFERENCE_SKUS["ampere"]).sm_count
    ampere, fitted = fit_efficiency(
        frame, groups, a100, "ampere",
        replace(hopper, source="", comm_sm_share=NCCL_CHANNELS / sms,
                flash1_attention_peak_fraction=hopper.attention_peak_fraction),
        ("gemm_peak_fraction", "flash1_attention_peak_fraction", "memory_bw_fraction",
         FABRIC_PREFIX + "roce"))
    # llm-foundry's tables ran FlashAttention-1's generation (its profile's attention_kernel);
    # no fitted A100 run uses FlashAttention-2's kernels, so theirs is the cited prior
    ampere = replace(ampere, attention_peak_fraction=FA2_A100_PRIOR)
    n_sc21 = int((a100 & frame["source"].eq("megatron-sc21")).sum())
    ampere = replace(ampere, source="fitted by python -m tcf_search.calibration.fit on "
                     f"{int(a100.sum()) - n_sc21} llm-foundry A100 and {n_sc21} Megatron SC21 "
                     "runs of non-held-out groups (GEMM, FlashAttention-1 and memory-bound "
                     "fractions; FlashAttention-2's a prior, the low end of the 50-73% of A100's "
                     "peak Dao (2023, arXiv 2307.08691) reports; the rest, and the network "
                     "fraction of clusters whose fabric is not given, from hopper)")
    fabrics = {k.removeprefix(FABRIC_PREFIX): v for k, v in fitted.items()}
    fitted_rows = a100.to_numpy()
    rows_on = {fid: sum(int(fitted_rows[g.index].sum()) for g in groups
                        if g.cluster.fabric == fid) for fid in fabrics}
    return ampere, fabrics, rows_on


def print_prior_fabrics() -> None:
    for fid in PRIOR_FABRICS:
        fab = get_fabric(fid)
        print(f"fabric {fid}: network_bw_fraction {fab.network_bw_fraction} is a prior, not "
              f"fitted (its rows cannot identify it; see fit.py PRIOR_FABRICS): {fab.source}")


def fitted_fabrics(roce: dict[str, float], rows_on: dict[str, int],
                   efa: tuple[dict[str, float], dict[str, float]], n_efa: int,
                   ) -> dict[str, tuple[float, float | None, str]]:
    """What fabrics.yaml gets: the A100 fit's fabrics (a network fraction each) and the
    Playbook cluster's (its fraction and ring step), with the rows they were fitted on."""
    out: dict[str, tuple[float, float | None, str]] = {
        f: (v, None, f"{rows_on[f]} non-held-out A100 runs on {f}, with the ampere parameters "
                     "(see calibration.yaml)") for f, v in roce.items()}
    out[MEASURED_FABRIC] = (efa[0][MEASURED_FABRIC], efa[1][MEASURED_FABRIC],
                            f"{n_efa} non-held-out Playbook H100 runs on {MEASURED_FABRIC}, "
                            "with the hopper parameters (see calibration.yaml)")
    return out


def write_fabrics(fitted: dict[str, tuple[float, float | None, str]]) -> None:
    """Rewrite the fitted fields of fabrics.yaml (each fabric's network fraction, its ring step
    where fitted, and the rows they were fitted on), keeping its header comment and
    descriptions."""
    path = CATALOG_DIR / "fabrics.yaml"
    text = path.read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    doc = yaml.safe_load(text)
    for fid, (fraction, step, rows) in fitted.items():
        doc[fid]["network_bw_fraction"] = round(fraction, 4)
        if step is not None:
            doc[fid]["network_step_latency_s"] = float(f"{step:.4g}")
        doc[fid]["source"] = f"fitted by python -m tcf_search.calibration.fit on {rows}"
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=100))
    print("wrote", path)


def fit_playbook(frame: pd.DataFrame, groups: list[Group], rows: pd.Series, start: Efficiency,
                 fitted: dict[str, float] | None = None) -> tuple[Efficiency, dict[str, float]]:
    """Hopper's attention, memory-bound and NVLink terms with nanotron's host terms and the
    Playbook cluster's fabric's network fraction and ring step, on ``rows``: the Playbook's H100
    runs and llm-foundry's single-node ones (the GEMM fractions held). The family then prices a
    cluster that names no fabric as that one (its ``network_fabric``)."""
    eff, values = fit_efficiency(
        frame, groups, rows, "hopper", start, PLAYBOOK_PARAMS, framework="nanotron",
        start_values=fitted or {"host_overhead_s": 5e-5, "pp_tp_step_overhead_s": 2e-4,
                                FABRIC_STEP_PREFIX + MEASURED_FABRIC: NCCL_NET_STEP_S})
    fractions, steps = fabric_values(values)
    return replace(eff, network_fabric=MEASURED_FABRIC,
                   network_bw_fraction=fractions[MEASURED_FABRIC],
                   network_step_latency_s=steps[MEASURED_FABRIC]), values


def training_values(fitted: dict[str, float]) -> dict[str, float]:
    """The nanotron profile's fitted terms among the Playbook fit's values."""
    return {k: v for k, v in fitted.items() if k in TRAINING_PARAMS}


def foundry_node_rows(frame: pd.DataFrame, family: str) -> pd.Series:
    """llm-foundry's ok runs on one node of ``family``'s GPUs. The Playbook runs one sequence
    length (4,096), where attention and the per-token kernels (memory-bound, GEMM) grow alike
    with the tokens and the fit cannot tell them apart; these runs span 512-65,536 tokens a
    sequence, and within a node they need no assumption about a fabric the source does not give."""
    one_node = frame["num_gpus"] <= frame["gpus_per_node"]
    return (frame["source"].eq("llm-foundry") & frame["status"].eq("ok") & one_node
            & regime(frame).str.startswith(family + "/"))


def dgxc_rows(frame: pd.DataFrame, dense_only: bool = True) -> pd.Series:
    """NVIDIA's DGX Cloud benchmark rows (NeMo); dense models only unless ``dense_only`` is
    off (the MoE rows are item 3's: load imbalance and the dispatcher are not fitted here)."""
    rows = frame["source"].eq("dgxc-benchmarking") & frame["status"].eq("ok")
    return rows & frame["moe_experts"].isna() if dense_only else rows


def fit_dgxc(frame: pd.DataFrame, groups: list[Group], rows: pd.Series, family: str,
             start: Efficiency, params: tuple[str, ...]) -> Efficiency:
    """``family``'s GEMM terms on the dgxc rows of ``rows``, the rest of ``start`` held."""
    rows = rows & regime(frame).str.startswith(family + "/")
    eff, _ = fit_efficiency(frame, groups, rows, family, start, params)
    print(f"{family} on dgxc:", {p: round(getattr(eff, p), 4) for p in params})
    return eff


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=None)
    ap.add_argument("--write", action="store_true",
                    help="write hardware_catalog/calibration.yaml and frameworks.yaml")
    ap.add_argument("--moe-only", action="store_true",
                    help="fit only the MoE stage, on the current calibration (writes only "
                    "calibration.yaml's MoE terms with --write)")
    args = ap.parse_args(argv)
    csv = args.csv or find_measured_csv()
    if csv is None:
        print("measured_runs.csv not found (expected at ../shared/data/); pass --csv")
        return 2
    frame = pd.read_csv(csv)
    groups, _ = load_groups(frame)
    held = split_mask(frame)
    train = ~held
    if args.moe_only:
        return moe_only(frame, groups, held, args.write)

    pb_ok = (frame["source"].eq("playbook") & frame["status"].eq("ok")
             & frame["peak_mem_gib"].notna())
    memory = fit_memory(frame, groups, pb_ok & train)
    nanotron = {k: memory.pop(k) for k in FRAMEWORK_MEM_PARAMS}
    # the efficiencies are fitted without the allocator stall, which is fitted on them after
    groups = with_training(groups, "nanotron", memory_model={**nanotron, "pressure_slowdown": 0.0})
    print("allocator:", memory, "nanotron memory:", nanotron)

    foundry = foundry_node_rows(frame, "hopper") & train
    hop_rows = (throughput_rows(frame) & train) | foundry
    mem_groups = [replace(g, training=g.training.with_switches(memory_model=replace(
        g.training.framework.memory_model, **memory))) for g in groups]  # type: ignore[arg-type]
    # FlashAttention-3 / cuDNN start at 1.5x FlashAttention-2's prior (Shah et al., 2024)
    start = replace(Efficiency(), **GEMM_PRIOR,  # type: ignore[arg-type]
                    flash3_attention_peak_fraction=1.5 * Efficiency().attention_peak_fraction)
    hopper, fitted = fit_playbook(frame, mem_groups, hop_rows, start)
    # the GEMM and fp8 fractions on NVIDIA's tables, then the Playbook's terms again with them
    dgxc = dgxc_rows(frame) & train
    hopper = fit_dgxc(frame, mem_groups, dgxc, "hopper", hopper, DGXC_PARAMS)
    hopper, fitted = fit_playbook(frame, mem_groups, hop_rows, hopper, fitted)
    hopper = fit_dgxc(frame, mem_groups, dgxc, "hopper", hopper, DGXC_PARAMS)
    mm = allocator_model(memory, int((pb_ok & train).sum()))
    bounds = launched_bounds(frame, mem_groups, train)  # stacks whose runs report no memory
    print("launched runs' fragmentation bounds:", bounds)
    nanotron.update(training_values(fitted))
    fabrics = fabric_values(fitted)
    groups = with_training(with_fabrics(mem_groups, *fabrics), "nanotron",
                           memory_model={**nanotron_memory(nanotron), "pressure_slowdown": 0.0},
                           **training_values(fitted))
    nanotron.update(fit_pressure(frame, groups, hop_rows & ~foundry, {"hopper": hopper}))
    groups = with_training(groups, "nanotron", memory_model=nanotron_memory(nanotron))
    n_dgxc = len(covered(groups, dgxc & regime(frame).str.startswith("hopper/")))
    hopper = replace(hopper, source="fitted by python -m tcf_search.calibration.fit on "
                     f"{int((hop_rows & ~foundry).sum())} Playbook H100 ok runs (pp=1 or "
                     f"after_pp_fix), {int(foundry.sum())} llm-foundry single-node H100 runs "
                     f"(the two weighing alike) and {n_dgxc} dgxc-benchmarking H100 dense runs "
                     "(GEMM, cuDNN attention, fp8 GEMM and fp8 cast) of non-held-out (model, "
                     "num_gpus) groups; GEMM half-size from prior")
    print("hopper:", hopper)
    print("nanotron profile:", nanotron)
    ampere, roce, rows_on = fit_ampere(frame, groups, train, hopper)
    print("ampere:", ampere, "fabrics:", roce, "efa:", fabrics)
    print_prior_fabrics()

    blackwell = fit_blackwell(frame, groups, dgxc, hopper)
    effs = {"hopper": hopper, "ampere": ampere, "blackwell": blackwell}
    for family in (f for f in FAMILIES if f != "cpu"):
        # no measurements: carry the newest fitted family over, and say so
        effs.setdefault(family, replace(hopper, source="transferred from the hopper fit: no "
                                        f"measured {family} runs to fit"))
    effs = fit_moe(frame, groups, train, effs)  # the MoE stage, on the dense terms just fitted
    report_fit(frame, groups, held, effs)
    if args.write:
        write_calibration(effs, mm, nanotron, stack_fractions(bounds, mm.allocator_fraction))
        n_efa = sum(int((hop_rows & ~foundry).to_numpy()[g.index].sum()) for g in groups
                    if g.cluster.fabric == MEASURED_FABRIC)
        write_fabrics(fitted_fabrics(roce, rows_on, fabrics, n_efa))
        # the catalogs just written are cached here: the bounds are made where they are read
        subprocess.run([sys.executable, "-m", "tcf_search.calibration.uncertainty"], check=True)
    return 0


def fit_blackwell(frame: pd.DataFrame, groups: list[Group], dgxc: pd.Series,
                  hopper: Efficiency) -> Efficiency:
    """Blackwell's GEMM fractions on NVIDIA's GB200 dense rows, the rest hopper's."""
    blackwell = fit_dgxc(frame, groups, dgxc, "blackwell", hopper, BLACKWELL_PARAMS)
    n_bw = len(covered(groups, dgxc & regime(frame).str.startswith("blackwell/")))
    return replace(blackwell, source="fitted by python -m tcf_search.calibration.fit on "
                   f"{n_bw} dgxc-benchmarking GB200 dense runs of non-held-out groups (bf16 "
                   "and fp8 GEMM fractions); attention, memory-bound, cast, overhead and "
                   "link terms borrowed from hopper, unvalidated")


def report_fit(frame: pd.DataFrame, groups: list[Group], held: pd.Series,
               effs: dict[str, Efficiency]) -> None:
    """The fitted model's errors: MoE rows, held-out and all rows, and interval coverage."""
    report_moe(frame, groups, held, effs)
    pred = predict_groups(groups, len(frame), effs)
    print("held-out:", json.dumps(report(frame, pred, held), indent=1))
    print("all rows:", json.dumps(report(frame, pred), indent=1))
    print("interval coverage (two-fold over held-out groups):",
          json.dumps(coverage(frame, pred, held), indent=1))


def moe_only(frame: pd.DataFrame, groups: list[Group], held: pd.Series, write: bool) -> int:
    """The MoE stage alone, on the calibration as written (its dense terms held)."""
    effs = load_calibration(CATALOG_DIR)
    effs = fit_moe(frame, groups, ~held, effs)
    report_moe(frame, groups, held, effs)
    if write:
        print("wrote", write_efficiencies(effs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
