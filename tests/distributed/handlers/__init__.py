"""Tests of mmcirc.distributed.handlers (a package, so that test_core.py /
test_circulant.py do not clash with tests/ops' modules of the same names)."""
