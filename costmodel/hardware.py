"""The hardware the cost model prices: one GPU's peaks and achieved efficiencies (``GpuSpec``,
``Efficiency``; the catalog fills them from cited data) and the cluster they form
(``ClusterSpec``). Frozen, keyword-only dataclasses in SI units."""

from __future__ import annotations

from dataclasses import dataclass, field

from costmodel.errors import SpecError, require_nonnegative, require_positive


@dataclass(frozen=True, slots=True, kw_only=True)
class Efficiency:
    """Calibrated, physically meaningful efficiency parameters of one SKU family.

    gemm_peak_fraction: the fraction of dense peak a large, well-shaped GEMM reaches.
    gemm_half_size: the GEMM's smallest dimension at which it reaches half of that fraction's
        headroom above the memory roofline (captures small, TP-sharded GEMMs losing efficiency).
    attention_peak_fraction: fraction of dense peak reached by flash-attention kernels
        (FlashAttention-2's generation).
    flash1_attention_peak_fraction: the same for FlashAttention-1's generation (its CUDA
        kernels, and the Triton port llm-foundry's MPT runs as ``attn_impl: triton``), which
        Dao (2023, FlashAttention-2, arXiv 2307.08691, abstract) puts at 25-40% of peak on A100
        against FlashAttention-2's 50-73%; 0 where the family's runs do not tell the two apart
        (then ``attention_peak_fraction``).
    flash3_attention_peak_fraction: the same for the Hopper-and-later generation
        (FlashAttention-3, cuDNN fused attention through Transformer Engine), on the families
        that have it.
    memory_bw_fraction: fraction of HBM bandwidth reached by memory-bound elementwise kernels.
    kernel_overhead_s: fixed launch/synchronisation time per kernel on the GPU.
    collective_overhead_s: fixed cost of one collective call beyond link latency (launch,
        stream synchronisation, the host waiting on the result in eager frameworks).
    nvlink_bw_fraction / network_bw_fraction: collective bus bandwidth reached, as a fraction
        of the link's unidirectional bandwidth.
    network_step_latency_s: what one ring step across the network waits, fitted with
        network_bw_fraction on the family's reference cluster, and like it used where a cluster
        names no fabric; 0 = not fitted: the GPU's NCCL prior (``GpuSpec.network_latency_s``).
    network_fabric: the fabric of the family's measured cluster (hardware_catalog/fabrics.yaml),
        whose network fraction and ring step the two fields above then are (the catalog reads
        them from the fabric, so a fabric's figures are written once); "" for a prior.
    p2p_network_bw_fraction: one send/receive pair across the network (pipeline activations,
        nanotron's logits hop, context parallelism's ring of K/V blocks), as a fraction of the
        GPU's own NIC line rate: a single transfer over one NIC, no ring of ranks in lockstep, so
        it does not carry the collectives' fraction (a cited prior; see its default).
    fp8_gemm_peak_fraction: the fraction of the dense fp8 peak a large fp8 GEMM reaches (fp8
        tensor cores reach a smaller share of their doubled peak than bf16 ones of theirs).
    comm_sm_share: the share of the GPU's SMs an NCCL collective's kernel occupies while it runs
        (one CTA per channel, each holding an SM): compute that communication hides behind runs
        that much slower for as long as the collective runs beside it.
    fp8_cast_bytes_per_element: HBM bytes Transformer Engine's quantisation moves per GEMM input
        element, forward: the cast and transpose (read bf16, write fp8 twice: 4) and its amax
        reduction; backward does the same for the output gradient (the 2x of the backward).
    all_to_all_bw_ratio: the EP all-to-all's bandwidth over the ring collectives' on the same
        links (``nvlink_bw_fraction``, the network's or its fabric's fraction), never above the
        link itself: NCCL's all-to-all is one send and one receive per peer, no ring.
    flex_nvlink_bw_fraction / flex_network_bw_fraction: what DeepEP-style fused dispatch and
        combine (Megatron-Core's flex dispatcher: DeepEP, HybridEP) reach of the NVLink and of
        the NIC's line rate. Their own kernels (NVSHMEM, RDMA writes with NVLink forwarding), not
        NCCL's all-to-all, so not ``all_to_all_bw_ratio``: cited priors (see their defaults).
    host_link_bw_fraction: what a pinned device-host copy reaches of the host link (a prior).
    flex_overlap_credit: the share of what Megatron-Core's combined 1F1B schedule can hide of the
        fused (flex) dispatch's exchange (``costmodel.parallel.expert.paired_exposed``'s compute
        windows) that it does hide: 1 as the windows say, 0 as if not overlapped (a prior).
    source: where the numbers come from (a fit and its rows, or a prior).
    """

    gemm_peak_fraction: float = 0.75
    gemm_half_size: float = 256.0
    attention_peak_fraction: float = 0.55
    flash1_attention_peak_fraction: float = 0.0
    flash3_attention_peak_fraction: float = 0.6
    memory_bw_fraction: float = 0.7
    kernel_overhead_s: float = 4e-6
    collective_overhead_s: float = 20e-6
    nvlink_bw_fraction: float = 0.8
    network_bw_fraction: float = 0.8
    network_step_latency_s: float = 0.0
    network_fabric: str = ""
    # NCCL's point-to-point peak per NIC, as NVIDIA's NCCL engineers state it: an all-to-all
    # (one send and receive per peer) "cannot aggregate the bandwidth of multiple NICs", and a
    # 400 Gb/s NDR ConnectX-7 NIC (50 GB/s) "should achieve up to 48-49GB/s"
    # (github.com/NVIDIA/nccl-tests/issues/267, 2024-11-19 and 2025-01-23); 24 GB/s is the peak
    # of a 200 Gb/s HDR NIC (github.com/NVIDIA/nccl-tests/issues/119, 2022-11-17): 0.96 of
    # line rate on both, what one GPU's transfer to one peer over its own NIC reaches
    p2p_network_bw_fraction: float = 0.96
    # host time one op on a TP-sharded DTensor costs beyond a plain op (sharding propagation,
    # redistribute bookkeeping in Python): measured by `tcf-search calibrate`, 0 where not
    dtensor_op_overhead_s: float = 0.0
    fp8_gemm_peak_fraction: float = 0.6
    fp8_cast_bytes_per_element: float = 4.0
    all_to_all_bw_ratio: float = 1.0
    # DeepEP's README (github.com/deepseek-ai/DeepEP, "Normal kernels with NVLink and RDMA
    # forwarding"; H800, NVLink ~160 GB/s, CX7 400 Gb/s ~50 GB/s): 153 GB/s within a node, and
    # over RDMA 43 GB/s at EP 16 (58 and 51 at EP 32 and 64): 0.96 of NVLink, 0.86 of the NIC,
    # the smallest internode figure; its RDMA bytes count a token once per destination node,
    # the sender's own included (tests/legacy/test_internode.py num_rdma_token_sent), and
    # costmodel/parallel/expert.py counts them so
    flex_nvlink_bw_fraction: float = 153.0 / 160.0
    flex_network_bw_fraction: float = 43.0 / 50.0
    # NCCL runs one CTA per channel (NCCL_MIN_CTAS / NCCL_MAX_CTAS bound them; docs/env.html)
    # and opens 16 channels on an 8-GPU NVSwitch node (NCCL_NVLS_NCHANNELS' default, the ring's
    # count there too): 16 of H100's 132 SMs
    comm_sm_share: float = 16.0 / 132.0
    # copy engines, no SMs; a prior, not fitted (no measured run offloads): pinned copies over
    # PCIe x16 measure about 80% of line rate (CUDA samples' bandwidthTest: ~25 of 32 GB/s on
    # Gen4, ~50 of 64 on Gen5)
    host_link_bw_fraction: float = 0.8
    # the schedule's windows as they are: no measured row tells this share from the flex
    # fractions (the one that overlaps a fused dispatch, DeepSeek-V3 on B200, is predicted 9%
    # slow at 1); prior_ranges.yaml gives its range
    flex_overlap_credit: float = 1.0
    source: str = "prior"


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """One accelerator SKU as the cost model needs it. Bandwidths are unidirectional per GPU."""

    id: str
    name: str = ""
    family: str = ""  # calibration family: ampere, hopper, blackwell, ada, cdna3, ... (catalog)
    peak_flops_bf16: float
    peak_flops_fp16: float
    # 0: no FP8 tensor cores (A100): the GPU does not offer fp8 (``precisions``)
    peak_flops_fp8: float = 0.0
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    intra_node_bw_bytes_per_s: float
    intra_node_domain_size: int
    network_bw_bytes_per_s: float
    intra_node_latency_s: float = 3e-6
    network_latency_s: float = 10e-6
    memory_reserve_bytes: float = 1.5 * 2**30
    # the GPU's own link to host memory, one direction (PCIe, or Grace's NVLink-C2C), and the
    # host memory each GPU may pin: what activation offloading (costmodel/offload.py) moves
    # over and fills. 0: not catalogued, nothing is offloaded
    host_link_bw_bytes_per_s: float = 0.0
    host_memory_bytes: float = 0.0
    # the share of the GPU's network traffic that crosses that link (1: the NIC hangs off the
    # GPU's PCIe link; 0: apart, as from Grace's NVLink-C2C)
    host_link_network_share: float = 0.0
    # bytes a weight's cached fp8 copy holds per element (Transformer Engine's workspace for a
    # bf16 weight): the fp8 data, and beside it its transpose where the GPU's fp8 GEMMs take
    # only the TN layout (before SM 10.0: Hopper, Ada), for the backward's data gradient
    fp8_weight_copy_bytes: float = 1.0
    # the highest bf16 matmul rate measured on the SKU (maximum achievable matmul FLOP/s): what
    # a fit borrowed from another family keeps its share of (hardware_catalog.catalog.
    # transfer_efficiency). 0: none measured
    matmul_bf16_flops: float = 0.0
    # the host CPU's time to issue a framework operation over an x86 DGX host's (the frameworks'
    # ``host_overhead_s``): a Grace CPU's is longer (costmodel.kernels.host_op_s)
    host_issue_factor: float = 1.0
    # streaming multiprocessors (compute units on AMD): a communication kernel running beside
    # compute holds some of them (costmodel/parallel/expert.py). 0: not catalogued, not priced
    sm_count: int = 0
    efficiency: Efficiency = field(default_factory=Efficiency)

    def __post_init__(self) -> None:
        require_positive(f"gpu[{self.id}]", peak_flops_bf16=self.peak_flops_bf16,
                  peak_flops_fp16=self.peak_flops_fp16,
                  hbm_bytes=self.hbm_bytes, hbm_bw_bytes_per_s=self.hbm_bw_bytes_per_s,
                  intra_node_bw_bytes_per_s=self.intra_node_bw_bytes_per_s,
                  intra_node_domain_size=self.intra_node_domain_size,
                  network_bw_bytes_per_s=self.network_bw_bytes_per_s,
                  intra_node_latency_s=self.intra_node_latency_s,
                  network_latency_s=self.network_latency_s)
        for key in ("id", "name", "family"):  # a study's gpu_spec may hold anything
            if not isinstance(getattr(self, key), str):
                raise SpecError(f"gpu.{key} must be text, but got {getattr(self, key)!r}")
        # reserve >= hbm is legal (then nothing fits); a host link of 0: none catalogued
        require_nonnegative(f"gpu[{self.id}]", **{key: getattr(self, key) for key in (
            "peak_flops_fp8", "memory_reserve_bytes", "host_link_bw_bytes_per_s",
            "host_memory_bytes", "host_link_network_share", "fp8_weight_copy_bytes",
            "sm_count", "matmul_bf16_flops")})
        require_positive(f"gpu[{self.id}]", host_issue_factor=self.host_issue_factor)
        if self.host_link_network_share > 1:
            raise SpecError(f"gpu[{self.id}].host_link_network_share must be in [0, 1], but got "
                            f"host_link_network_share={self.host_link_network_share!r}")

    @property
    def precisions(self) -> tuple[str, ...]:
        """The training precisions the GPU's tensor cores offer: fp8 only where the catalog
        gives an FP8 peak (Transformer Engine refuses FP8 below SM 8.9, so A100 has none)."""
        return ("bf16", "fp16") + (("fp8",) if self.peak_flops_fp8 > 0 else ())

    def check_precision(self, precision: str) -> None:
        """One line naming the GPU, the precision asked and those it offers, where it lacks it."""
        if precision not in self.precisions:
            raise SpecError(f"training.precision: {self.id} has no {precision} tensor cores "
                            f"(it offers {', '.join(self.precisions)}), but got {precision!r}")

    def peak_flops(self, precision: str) -> float:
        self.check_precision(precision)
        return {"bf16": self.peak_flops_bf16, "fp16": self.peak_flops_fp16,
                "fp8": self.peak_flops_fp8}[precision]

    @property
    def usable_bytes(self) -> float:
        return self.hbm_bytes - self.memory_reserve_bytes

    @property
    def synchronous(self) -> bool:
        """A CPU rank runs each kernel on the thread that issues it and its collectives (gloo)
        on the same cores: host time, kernels and communication add up, nothing overlaps."""
        return self.family == "cpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredLinks:
    """A cluster's own collective links, fitted on its nccl-tests output (``tcf-search calibrate
    --nccl-tests``) the way :mod:`costmodel.comm` prices a collective; they replace the SKU
    family's fitted fractions and latencies for that cluster. A bandwidth or latency of 0 was not
    measured (no file exercised it): the family's value stays.

    nvlink_bw_bytes_per_s / network_bw_bytes_per_s: what a ring collective's NVLink phase and its
        network phase reach per GPU (bus bandwidth, nccl-tests' convention).
    nvlink_step_latency_s / network_step_latency_s: what one ring step waits on that link.
    p2p_network_bw_bytes_per_s: one send/receive pair across the network (sendrecv_perf).
    source: what they rest on ("3 nccl-tests of this cluster (files), date"), for the reports.
    """

    nvlink_bw_bytes_per_s: float = 0.0
    network_bw_bytes_per_s: float = 0.0
    nvlink_step_latency_s: float = 0.0
    network_step_latency_s: float = 0.0
    p2p_network_bw_bytes_per_s: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        require_nonnegative("cluster.calibration", **{key: getattr(self, key) for key in (
            "nvlink_bw_bytes_per_s", "network_bw_bytes_per_s", "nvlink_step_latency_s",
            "network_step_latency_s", "p2p_network_bw_bytes_per_s")})


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterSpec:
    gpu: GpuSpec
    num_gpus: int
    gpus_per_node: int = 8
    # The inter-node fabric when known (hardware_catalog/fabrics.yaml) and the collective bus
    # bandwidth it reaches, as a fraction of the NIC's; None keeps the GPU family's calibrated
    # network_bw_fraction (a fabric is a property of the cluster, not of the GPU).
    fabric: str = ""
    network_bw_fraction: float | None = None
    # and what one ring step across it waits, where measured runs fitted it (None: the GPU's
    # NCCL prior under a named fabric, the family's fitted step without one)
    network_step_latency_s: float | None = None
    # its topology (hardware_catalog/fabrics.yaml): nodes whose rails share leaf switches (a DGX
    # SuperPOD scalable unit; 0: not given, one group) and the leaves' downlink over uplink
    # bandwidth into the spine (1: non-blocking); an all-to-all that leaves a group crosses it
    rail_group_nodes: int = 0
    oversubscription: float = 1.0
    # the cluster's own links, measured (nccl-tests): they override the fractions above
    links: MeasuredLinks | None = None

    def __post_init__(self) -> None:
        require_positive("cluster", num_gpus=self.num_gpus, gpus_per_node=self.gpus_per_node)
        f = self.network_bw_fraction
        if f is not None and not 0.0 < f <= 1.0:
            raise SpecError(f"cluster.network_bw_fraction must be in (0, 1], but got {f}")
        if self.rail_group_nodes < 0 or not self.oversubscription >= 1.0:
            raise SpecError(f"cluster.rail_group_nodes >= 0 and cluster.oversubscription >= 1 "
                            f"must hold, but got {self.rail_group_nodes} and "
                            f"{self.oversubscription}")
        step = self.network_step_latency_s
        if step is not None and not 0.0 < step < 1.0:
            raise SpecError(f"cluster.network_step_latency_s must be in (0, 1) seconds, "
                            f"but got {step}")

    @property
    def nvlink_domain(self) -> int:
        """The job's GPUs that share one fast intra-node fabric: a node, or the job's segment of
        a rack-scale NVLink domain (an NVL72 rack of 18 four-GPU trays). A rack-scale job is
        allocated in equal segments of whole nodes, the most nodes that divide the job's and fit
        one rack, as NVIDIA's launcher asks Slurm for them (NVIDIA/dgxc-benchmarking v26.02,
        cli/llmb-run/src/llmb_run/job_launcher.py ``_compute_segment_size``: ``--segment``, 16
        trays for a power-of-two node count, 18 for a multiple of 18): 128 GB200 are two
        segments of 64, not a full rack of 72 and 56 more."""
        rack = self.gpu.intra_node_domain_size
        if rack <= self.gpus_per_node:
            return self.gpus_per_node
        nodes = -(-self.num_gpus // self.gpus_per_node)
        fits = min(nodes, max(rack // self.gpus_per_node, 1))
        segment = max(d for d in range(1, fits + 1) if nodes % d == 0)
        return segment * self.gpus_per_node
