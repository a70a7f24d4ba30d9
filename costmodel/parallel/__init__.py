"""Communication of each parallelism, one module per dimension: tensor (and sequence) parallel,
context parallel, expert parallel and data parallel by ZeRO stage. Each turns the plan's groups
(:class:`~costmodel.parallel.mesh.Mesh`) and the basic collective costs of
:mod:`costmodel.comm` into what its collectives take per layer or per step, what of it stays on
the critical path, and its rows of the step's collectives table. The pipeline's point-to-point
traffic lives with the pipeline (:mod:`costmodel.pipeline`)."""
