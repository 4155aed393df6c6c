"""Time and peak memory measured (the benchmark harness); what a model computes (FLOPs,
attention maps) is :mod:`mmcirc.analysis`'s. The command: ``python -m mmcirc.benchmark
SUITE`` (:mod:`~mmcirc.benchmark.command`); the suites, one module each, are
:mod:`~mmcirc.benchmark.suites`, whose timing grids :mod:`~mmcirc.benchmark.grid` drives
over the registered models (:mod:`~mmcirc.benchmark.cases`), measured in isolated
children (:mod:`~mmcirc.benchmark.tasks`, :mod:`~mmcirc.benchmark.runner`,
:mod:`~mmcirc.benchmark.measurement`) and written by :mod:`~mmcirc.benchmark.report`;
the documentation's tables are rendered from the suites' stores by
``.dev_scripts/benchmark_docs.py`` (repository upkeep).

Torch only; mmdet / mmseg / timm are imported by the cases that need them, submodules on
use (the isolated child imports only what its target needs).
"""
