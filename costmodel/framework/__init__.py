"""What a training framework does, as one typed profile: :class:`FrameworkProfile`.

A profile is a few frozen groups by concern (numerics, data parallelism, tensor and pipeline
parallelism, attention, kernels, activations, MoE) plus the calibrated :class:`MemoryModel`.
Their fields carry no defaults: every value comes from ``hardware_catalog/frameworks.yaml``
(its ``generic`` profile names every switch once, each framework overrides some), a study's
allowed overrides or a measured row's release switches, through
``hardware_catalog.frameworks.framework_profile``. The cost model only reads them.

A switch's name is unique across the groups and is the key that frameworks.yaml, a study, a
plan file and a measured row's release use for it: :meth:`FrameworkProfile.from_switches`
routes flat ``name: value`` pairs to their groups and :meth:`FrameworkProfile.switches` gives
them back flat.
"""


from costmodel.framework.layer import Activations, Attention, Kernels, Numerics
from costmodel.framework.parallel import DataParallel, Moe, Pipeline, TensorParallel
from costmodel.framework.profile import GROUPS, SWITCH_GROUP, FrameworkProfile, switch_names

__all__ = ["GROUPS", "SWITCH_GROUP", "Activations", "Attention", "DataParallel",
           "FrameworkProfile", "Kernels", "Moe", "Numerics", "Pipeline", "TensorParallel",
           "switch_names"]
