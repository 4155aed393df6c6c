"""Quiet weight initialisation: ``BaseModule.init_weights`` and ``load_checkpoint`` log
every tensor at INFO through mmengine's current logger; mmcirc's tools and APIs run them
inside :func:`quiet_logger`."""

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
