"""The benchmark suites, one module each: ``python -m mmcirc.benchmark SUITE``
(:mod:`mmcirc.benchmark.command` builds a subcommand per module; ``SUITE --help`` lists
the flags). A suite declares itself: its docstring, ``SHARED`` (the shared flags it takes,
with its defaults), ``add_arguments(parser)``, ``check(options)`` and ``run(options)``;
the timing suites run on :func:`mmcirc.benchmark.grid.run_grid`. Adding a suite is adding
a module here.

=================  ==========================================
suite              what
=================  ==========================================
``layer``          one attention layer vs N (+ CPU targets)
``model``          whole models vs their peers, eager / compile
``compile_train``  toy training, eager vs compiled backbone
``sharded``        sharded whole-image inference vs P = 1
``launches``       ops per eager forward, host time vs peers
=================  ==========================================

The documentation's tables are rendered from the suites' stores by repository upkeep
outside the package (``.dev_scripts/benchmark_docs.py``).
"""
