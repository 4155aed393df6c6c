"""Shared by the timm tests: small variants of the registered models (the sizes of the
registered names, through timm's kwargs, with tiny widths and depths)."""

import pytest
import torch
from timm_variants import SMALL


@pytest.fixture
def small():
    """``small(name, **kwargs)``: the small variant of a registered model, eval mode."""
    import timm

    import mmcirc.timm  # noqa: F401  (registration)

    def make(name, **kwargs):
        torch.manual_seed(0)
        return timm.create_model(name, **dict(SMALL[name], **kwargs)).eval()

    return make
