import pytest
import torch

from mmcirc.utils.labels import banded_argmax


@pytest.mark.parametrize('band', [1, 3, 16, 40])
def test_banded_argmax_is_torch_argmax_with_ties(band):
    """Bands of classes merged one at a time give torch.argmax over all classes, ties
    (small integer scores) resolved to the first maximum as torch does."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 4, (37, 9, 11), generator=g).float()  # many ties
    bands = ((c0, scores[c0 : c0 + band].clone()) for c0 in range(0, 37, band))
    assert torch.equal(banded_argmax(bands), scores.argmax(0))
