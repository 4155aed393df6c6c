"""Whether a graph is being captured: the one check for code that runs a faster eager
form of an op only outside torch.jit tracing, dynamo compilation and torch.export (the
FLOP count, torch.compile and ONNX keep the plain ops).

This file depends on torch only.
"""

import torch

__all__ = ['graph_capture']


def graph_capture():
    """Whether torch.jit traces, dynamo compiles or torch.export exports this call."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()
