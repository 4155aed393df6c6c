"""Time and peak memory measured (the benchmark harness); what a model computes (FLOPs,
attention maps) is :mod:`mmcirc.analysis`'s. The command: ``python -m mmcirc.benchmark
SUITE`` (:mod:`~mmcirc.benchmark.command`). Torch only; mmdet / mmseg / timm imported by
the cases that need them.

* :mod:`~mmcirc.benchmark.runner`: the isolated child (timeout, ``RLIMIT_AS`` cap,
  out of memory as a result: ``run_isolated``);
* :mod:`~mmcirc.benchmark.measurement`: threads, peak-memory meters, one model's step under
  precision / compile / backward axes, round-robin timing with a budget;
* :mod:`~mmcirc.benchmark.cases`: the registered models (attention layers, backbones,
  isotropic models);
* :mod:`~mmcirc.benchmark.tasks`: measurements of cases in children (``measure``);
* :mod:`~mmcirc.benchmark.report`: environment, the merging JSON store, markdown
  tables with ratios against a baseline;
* :mod:`~mmcirc.benchmark.grid`: the one driver of the timing suites (store -> measure ->
  record -> save -> table, one record layout) and the checks of their flags;
* :mod:`~mmcirc.benchmark.baselines`: the baseline attention layers the cases build;
* :mod:`~mmcirc.benchmark.suites`: the suites, one module each; the documentation's tables
  are rendered from their stores by ``.dev_scripts/benchmark_docs.py`` (repository upkeep).

Submodules are imported on use (the isolated child imports only what its target needs).
"""
