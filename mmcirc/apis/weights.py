"""How a checkpoint's weights fit a model, as mmengine's ``load_state_dict`` found it.

mmengine loads non-strictly: tensors the checkpoint lacks (``missing``), tensors of
another shape (torch's "size mismatch": they keep their initial values) and tensors the
model has no place for (``unexpected``) are listed in a multi-line log message and
loading goes on. :func:`recording_fit` collects those lists while mmengine loads, as
a :class:`WeightsFit`; :func:`~mmcirc.apis.builder.build_model` refuses a checkpoint
that leaves weights of the model unset (:class:`WeightsMismatchError`) unless asked for
partial loading. Training keeps mmengine's behaviour (fine-tuning from a backbone
checkpoint is normal); :class:`OneLineLoadSummary` turns mmengine's message into one
line (:meth:`WeightsFit.from_message`).
"""

import contextlib
import logging
import re
from dataclasses import dataclass, field, fields
from typing import List, Tuple

__all__ = ['OneLineLoadSummary', 'WeightsFit', 'WeightsMismatchError', 'recording_fit']

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


class WeightsMismatchError(ValueError):
    """A checkpoint that leaves weights of the model unset; ``fit`` says which."""

    def __init__(self, checkpoint: str, fit: WeightsFit):
        self.checkpoint, self.fit = checkpoint, fit
        super().__init__(
            f'checkpoint {checkpoint} does not fit the model: {fit.summary()} '
            '(allow_partial_weights=True loads it anyway, the rest random)'
        )


@contextlib.contextmanager
def recording_fit(model):
    """Inside the block, loading a state dict into ``model`` through mmengine's
    ``load_state_dict`` (``load_checkpoint``) records its lists; yields a
    :class:`WeightsFit` filled in when the block ends."""
    lists = {}

    def keep(module, state_dict, prefix, metadata, strict, missing, unexpected, errors):
        if not prefix:  # the root: mmengine's own lists, filled while it loads
            lists.update(missing=missing, unexpected=unexpected, errors=errors)

    fit = WeightsFit()
    handle = model.register_load_state_dict_pre_hook(keep)
    try:
        yield fit
    finally:
        handle.remove()
    if lists:
        done = WeightsFit.from_lists(lists['missing'], lists['unexpected'], lists['errors'])
        for f in fields(done):
            setattr(fit, f.name, getattr(done, f.name))


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
