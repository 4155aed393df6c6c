"""How a checkpoint's weights fit a model, as mmengine's ``load_state_dict`` found it.

mmengine loads non-strictly and lists the tensors the checkpoint lacks, those of another
shape (torch's "size mismatch": they keep their initial values) and those the model has
no place for in one multi-line log message. :func:`recording_fit` collects those lists
as a :class:`WeightsFit`, which :func:`~mmcirc.apis.builder.build_model` and a Runner's
:class:`WeightsFitHook` check; :class:`OneLineLoadSummary` turns the message into one line.
"""

import contextlib
import logging
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import List, Optional, Tuple

from mmengine.hooks import Hook

__all__ = [
    'OneLineLoadSummary',
    'RandomWeightsWarning',
    'WeightsFit',
    'WeightsFitHook',
    'WeightsMismatchError',
    'another_model',
    'checkpoint_fit',
    'recording_fit',
]

#: torch's per-tensor message for a tensor of another shape (``_load_from_state_dict``).
_SIZE_MISMATCH = re.compile(
    r'size mismatch for (\S+): copying a param with shape (?:torch\.Size\()?\[?([\d, ]*)\]?\)?'
    r' from checkpoint, the shape in current model is (?:torch\.Size\()?\[?([\d, ]*)\]?\)?'
)
#: mmengine's message (``mmengine.runner.checkpoint.load_state_dict``) and its sections.
MMENGINE_HEADER = 'The model and loaded state dict do not match exactly'
_UNEXPECTED = 'unexpected key in source state_dict: '
_MISSING = 'missing keys in source state_dict: '


def _shape(text: str) -> Tuple[int, ...]:
    return tuple(int(v) for v in text.replace(' ', '').split(',') if v)


def _keys(text: str) -> List[str]:
    return [k.strip() for k in text.split(',') if k.strip()]


@dataclass
class WeightsFit:
    """What loading a checkpoint left unset: ``missing`` (model tensors the checkpoint
    lacks; BN ``num_batches_tracked`` aside, as mmengine ignores them), ``mismatched``
    (``(key, checkpoint shape, model shape)``), ``errors`` (torch's other per-tensor
    messages) and, set nothing, ``unexpected`` (checkpoint tensors the model has no
    place for)."""

    missing: List[str] = field(default_factory=list)
    unexpected: List[str] = field(default_factory=list)
    mismatched: List[Tuple[str, tuple, tuple]] = field(default_factory=list)
    errors: List[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every weight of the model was loaded."""
        return not (self.missing or self.mismatched or self.errors)

    @classmethod
    def from_lists(cls, missing, unexpected, error_msgs) -> 'WeightsFit':
        """The fit of mmengine's (torch's) ``missing_keys``, ``unexpected_keys`` and
        ``error_msgs`` lists."""
        fit = cls(
            missing=[k for k in missing if 'num_batches_tracked' not in k],
            unexpected=list(unexpected),
        )
        for msg in error_msgs:  # mmengine appends its own summary lines to the list
            if str(msg).startswith((MMENGINE_HEADER, _UNEXPECTED, _MISSING)):
                continue
            m = _SIZE_MISMATCH.search(msg)
            if m:
                fit.mismatched.append((m.group(1), _shape(m.group(2)), _shape(m.group(3))))
            else:
                fit.errors.append(' '.join(str(msg).split()))
        return fit

    @classmethod
    def from_message(cls, message: str) -> 'WeightsFit':
        """The fit of mmengine's multi-line log message (:data:`MMENGINE_HEADER`)."""
        missing, unexpected, errors = [], [], []
        for line in str(message).splitlines():
            line = line.strip()
            if line.startswith(_MISSING):
                missing = _keys(line[len(_MISSING) :])
            elif line.startswith(_UNEXPECTED):
                unexpected = _keys(line[len(_UNEXPECTED) :])
            elif line and not line.startswith(MMENGINE_HEADER):
                errors.append(line)
        return cls.from_lists(missing, unexpected, errors)

    def summary(self, first: int = 3) -> str:
        """One line: how many tensors are missing, shaped otherwise, unexpected, each
        with its ``first`` keys (and the two shapes)."""

        def some(items, fmt=str):
            more = f', ... {len(items) - first} more' if len(items) > first else ''
            return ', '.join(fmt(i) for i in items[:first]) + more

        def shapes(item):
            key, ckpt, model = item
            return f'{key}: checkpoint {tuple(ckpt)}, model {tuple(model)}'

        parts = []
        if self.missing:
            parts.append(f'{len(self.missing)} missing ({some(self.missing)})')
        if self.mismatched:
            parts.append(
                f'{len(self.mismatched)} shaped otherwise ({some(self.mismatched, shapes)})'
            )
        if self.errors:
            parts.append(f'{len(self.errors)} not loaded ({some(self.errors)})')
        if self.unexpected:
            parts.append(f'{len(self.unexpected)} unexpected ({some(self.unexpected)})')
        return '; '.join(parts) if parts else 'every tensor loaded'


#: What :class:`WeightsMismatchError` advises by default (the library's keyword; the
#: commands print their flag, ``--allow-partial-weights``).
PARTIAL_ADVICE = 'allow_partial_weights=True loads it anyway, the rest random'


class WeightsMismatchError(ValueError):
    """A checkpoint that leaves weights of ``what`` unset; ``fit`` says which. One line:
    ``checkpoint PATH does not fit WHAT: <fit.summary()> (ADVICE)``."""

    def __init__(
        self, checkpoint: str, fit: WeightsFit, what: str = 'the model', advice=PARTIAL_ADVICE
    ):
        self.checkpoint, self.fit = checkpoint, fit
        super().__init__(
            f'checkpoint {checkpoint} does not fit {what}: {fit.summary()}'
            + (f' ({advice})' if advice else '')
        )


class RandomWeightsWarning(UserWarning):
    """Weights of the model are random: no checkpoint, or one loaded in part."""


def warn_partial(checkpoint: str, fit: WeightsFit) -> None:
    """The :class:`RandomWeightsWarning` of a ``checkpoint`` loaded in part (``fit``)."""
    warnings.warn(
        f'checkpoint {checkpoint} loaded in part: {fit.summary()}; the rest is random, '
        "the results are not the checkpoint's",
        RandomWeightsWarning,
    )


def _root_lists(loads: list):
    """A ``load_state_dict`` pre-hook that appends, for each load rooted at the module it
    is registered on, the (missing, unexpected, errors) lists that load fills."""

    def keep(module, state_dict, prefix, metadata, strict, missing, unexpected, errors):
        if not prefix:  # the root: mmengine's (torch's) own lists, filled while it loads
            loads.append((missing, unexpected, errors))

    return keep


@contextlib.contextmanager
def recording_fit(model):
    """Inside the block, loading a state dict into ``model`` through mmengine's
    ``load_state_dict`` (``load_checkpoint``) records its lists; yields a
    :class:`WeightsFit` filled in when the block ends."""
    loads = []
    fit = WeightsFit()
    handle = model.register_load_state_dict_pre_hook(_root_lists(loads))
    try:
        yield fit
    finally:
        handle.remove()
    if loads:
        vars(fit).update(vars(WeightsFit.from_lists(*loads[-1])))


def checkpoint_fit(model, checkpoint: dict) -> WeightsFit:
    """How a loaded ``checkpoint`` (a dict) fits ``model``, found by loading it as
    mmengine's Runner does (its ``state_dict``, else the dict itself, ``module.``
    prefixes dropped, mmengine's ``load_state_dict``) while recording (quiet)."""
    from mmengine.runner.checkpoint import load_state_dict

    from mmcirc.utils.quiet import quiet_logger

    state = checkpoint.get('state_dict', checkpoint)
    revised = OrderedDict((re.sub(r'^module\.', '', k), v) for k, v in state.items())
    revised._metadata = getattr(state, '_metadata', OrderedDict())
    with quiet_logger(logging.ERROR) as logger, recording_fit(model) as fit:
        load_state_dict(model, revised, strict=False, logger=logger)
    return fit


def another_model(fit: WeightsFit, model, prefix: str = '') -> bool:
    """Whether ``fit`` (a load into ``model``) shows a checkpoint of another model for
    the tensors under ``prefix`` (``'backbone.'``; ``''``: all): some shaped otherwise,
    or none of them loaded."""
    keys = [
        k for k in model.state_dict() if k.startswith(prefix) and 'num_batches_tracked' not in k
    ]
    part = part_of(fit, prefix)
    return bool(part.mismatched) or (bool(keys) and len(part.missing) >= len(keys))


def part_of(fit: WeightsFit, prefix: str) -> WeightsFit:
    """The tensors of ``fit`` under ``prefix``."""
    return WeightsFit(
        missing=[k for k in fit.missing if k.startswith(prefix)],
        unexpected=[k for k in fit.unexpected if k.startswith(prefix)],
        mismatched=[m for m in fit.mismatched if m[0].startswith(prefix)],
        errors=list(fit.errors),
    )


class OneLineLoadSummary(logging.Filter):
    """A logging filter that rewrites mmengine's multi-line "do not match exactly"
    message (``load_from``, ``init_cfg=dict(type='Pretrained')``) into one line
    (:meth:`WeightsFit.summary`); other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(MMENGINE_HEADER):
            fit = WeightsFit.from_message(message)
            record.msg = f'loaded weights: {fit.summary()}'
            if not fit.complete:
                record.msg += ' (those model tensors keep their initial values)'
            record.args = ()
        return True


#: The checks of :class:`WeightsFitHook`, by what the run does with the weights.
FIT_MODES = ('test', 'train', 'resume')
#: What a training run's refusal of another model's backbone names.
_ANOTHER_BACKBONE = "the config's backbone (a checkpoint of another model?)"


class WeightsFitHook(Hook):
    """A Runner's loaded weights, checked against its model as they load (the commands
    register it: ``tools/test.py`` with ``mode='test'``, ``tools/train.py`` with
    ``'train'`` or ``'resume'``). Its ``after_load_checkpoint`` (priority LOWEST: the
    checkpoint as the other hooks leave it, just before mmengine loads it) loads the
    checkpoint into the model while recording (:func:`checkpoint_fit`):

    - ``'test'``: a checkpoint that leaves weights of the model unset is refused
      (:class:`WeightsMismatchError`, before anything is scored) unless
      ``allow_partial``; a partial load warns once (:class:`RandomWeightsWarning`).
    - ``'train'`` (``load_from``, and ``init_cfg`` loads into the backbone, recorded
      from ``before_run``): fine-tuning loads what fits (heads of other shapes start
      new), but a checkpoint of another model's backbone (:func:`another_model`) is
      refused.
    - ``'resume'``: the checkpoint must fit the model in full and leave iterations or
      epochs to train (``train_cfg.max_iters`` / ``max_epochs`` above the
      checkpoint's), else a one-line ``ValueError``.

    ``checkpoint``: the path the messages name.
    """

    priority = 'LOWEST'

    def __init__(self, mode: str, checkpoint: Optional[str] = None, allow_partial=False):
        if mode not in FIT_MODES:
            raise ValueError(f'WeightsFitHook: mode must be one of {FIT_MODES}, got {mode!r}')
        self.mode, self.checkpoint, self.allow_partial = mode, checkpoint, allow_partial
        self._init_loads, self._handle = [], None

    @staticmethod
    def _model(runner):
        """The model the weights load into: without a DDP or test-time-augmentation
        wrapper (mmengine's ``load_state_dict`` unwraps both)."""
        from mmengine.model import BaseTTAModel, is_model_wrapper

        model = runner.model
        while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
            model = model.module
        return model

    def before_run(self, runner) -> None:
        backbone = getattr(self._model(runner), 'backbone', None)
        if self.mode == 'train' and backbone is not None:  # init_cfg=dict(type='Pretrained')
            init = getattr(backbone, 'init_cfg', None)
            inits = init if isinstance(init, list) else [init]
            files = [i['checkpoint'] for i in inits if isinstance(i, dict) and i.get('checkpoint')]
            self._init_checkpoint = f'{files[0]} (init_cfg)' if files else 'of init_cfg'
            self._handle = backbone.register_load_state_dict_pre_hook(_root_lists(self._init_loads))

    def _check_init_loads(self, runner) -> None:
        if self._handle is None:
            return
        self._handle.remove()
        self._handle = None
        backbone = self._model(runner).backbone
        for lists in self._init_loads:
            fit = WeightsFit.from_lists(*lists)
            if another_model(fit, backbone):
                raise WeightsMismatchError(self._init_checkpoint, fit, _ANOTHER_BACKBONE, None)
        self._init_loads.clear()

    def before_train(self, runner) -> None:
        self._check_init_loads(runner)

    def after_load_checkpoint(self, runner, checkpoint) -> None:
        self._check_init_loads(runner)
        if not isinstance(checkpoint, dict):
            return
        model = self._model(runner)
        fit = checkpoint_fit(model, checkpoint)
        path = self.checkpoint or 'load_from'
        if self.mode == 'resume':
            if not fit.complete:
                raise WeightsMismatchError(
                    path,
                    fit,
                    'the model of the config (changed since the checkpoint was saved?)',
                    'resume with the config it was saved with',
                )
            _check_left_to_train(runner, path, checkpoint.get('meta') or {})
        elif self.mode == 'train':
            prefix = 'backbone.' if hasattr(model, 'backbone') else ''
            if another_model(fit, model, prefix):
                raise WeightsMismatchError(path, part_of(fit, prefix), _ANOTHER_BACKBONE, None)
        elif not fit.complete:
            if not self.allow_partial:
                raise WeightsMismatchError(path, fit)
            from mmengine.dist import is_main_process

            if is_main_process():
                warn_partial(path, fit)


def _check_left_to_train(runner, path: str, meta: dict) -> None:
    """A one-line ``ValueError`` when resuming from ``meta`` (a checkpoint's) leaves no
    iteration or epoch of the run's train loop to train."""
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

    loop = runner.train_loop
    if isinstance(loop, IterBasedTrainLoop):
        done, end, unit, key = meta.get('iter', 0), loop.max_iters, 'iteration', 'max_iters'
    elif isinstance(loop, EpochBasedTrainLoop):
        done, end, unit, key = meta.get('epoch', 0), loop.max_epochs, 'epoch', 'max_epochs'
    else:
        return
    if isinstance(done, int) and done >= end:
        raise ValueError(
            f'nothing left to train: checkpoint {path} is at {unit} {done} and '
            f'train_cfg.{key} is {end}; raise train_cfg.{key} to train on'
        )
