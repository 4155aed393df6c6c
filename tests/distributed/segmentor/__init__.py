"""Tests of mmcirc.distributed.segmentor (a package: test_tool.py imports test_model.py's
cases)."""
