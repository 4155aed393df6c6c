"""The graph-capture check (mmcirc/ops/capture.py)."""

import torch

from mmcirc.ops.capture import graph_capture


def test_graph_capture_only_while_a_graph_is_captured():
    seen = []

    def record(x):
        seen.append(graph_capture())
        return x + 1

    record(torch.zeros(2))  # eager
    torch.jit.trace(record, torch.zeros(2), check_trace=False)
    assert seen == [False, True]
