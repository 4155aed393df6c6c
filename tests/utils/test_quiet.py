"""quiet_logger: mmengine's current logger hides INFO inside the block only."""

import logging

import pytest
from mmengine.logging import MMLogger

from mmcirc.utils.quiet import quiet_logger


def test_info_hidden_inside_and_level_restored_after_an_error():
    logger = MMLogger.get_current_instance()
    saved = logger.level
    logger.setLevel(logging.INFO)
    try:
        with pytest.raises(RuntimeError):
            with quiet_logger() as inside:
                assert inside is logger
                assert not logger.isEnabledFor(logging.INFO)
                assert logger.isEnabledFor(logging.WARNING)
                raise RuntimeError('init failed')
        assert logger.level == logging.INFO
    finally:
        logger.setLevel(saved)


def test_init_weights_prints_nothing_at_info(capsys):
    from mmengine.model import BaseModule
    from torch import nn

    class Net(BaseModule):
        def __init__(self):
            super().__init__(init_cfg=dict(type='Constant', layer='Linear', val=0.5))
            self.fc = nn.Linear(2, 2)

    logger = MMLogger.get_current_instance()
    saved = logger.level
    logger.setLevel(logging.INFO)
    try:
        net = Net()
        with quiet_logger():
            net.init_weights()
    finally:
        logger.setLevel(saved)
    assert float(net.fc.weight[0, 0].detach()) == 0.5  # the init ran
    captured = capsys.readouterr()
    assert 'fc.weight' not in captured.out + captured.err
