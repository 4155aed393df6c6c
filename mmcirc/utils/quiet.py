"""Quiet weight initialisation: the one helper mmcirc's tools and APIs use to keep
mmengine's logger from printing every parameter.

``BaseModule.init_weights`` and ``load_checkpoint`` log each initialised or loaded
tensor at INFO through mmengine's current logger; a tool that builds a model with
random weights (or loads a checkpoint) runs them inside :func:`quiet_logger`.
"""

import contextlib
import logging

__all__ = ['quiet_logger']


@contextlib.contextmanager
def quiet_logger(level=logging.WARNING):
    """Inside the block, mmengine's current logger shows ``level`` and above only; its
    own level is restored afterwards (also after an exception). Yields the logger."""
    from mmengine.logging import MMLogger

    logger = MMLogger.get_current_instance()
    saved = logger.level
    logger.setLevel(level)
    try:
        yield logger
    finally:
        logger.setLevel(saved)
