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


@pytest.mark.parametrize('offset', [0, 7])
def test_first_argmax_is_torch_max_with_ties_and_nan(offset):
    """(amax, first argmax) equal torch.max over the class axis, ties (integer scores)
    to the first index and NaN columns (NaN is the maximum) as torch has them."""
    from mmcirc.utils.labels import first_argmax

    g = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 3, (19, 8, 13), generator=g).float()
    scores[4, 2, 3] = scores[11, 5, 0] = float('nan')
    ref_val, ref_idx = scores.max(dim=0)
    val, idx = first_argmax(scores, offset)
    assert torch.equal(idx, ref_idx + offset)
    assert torch.allclose(val, ref_val, rtol=0, atol=0, equal_nan=True)
