"""The benchmark suites, one module each: ``python -m mmcirc.benchmark --help`` lists them
with the first paragraph of each module's docstring (how a suite declares itself:
:mod:`mmcirc.benchmark.command`; adding a suite is adding a module here)."""
