"""``torch.compile`` of what compiles whole: the image backbone (``backbone`` or
``image_encoder``) and its neck, each as one graph (``fullgraph=True``); the heads stay
eager (mmdet's and mmseg's heads, assigners and samplers break graphs and recompile on
each image's box count, as in mmengine's ``compile=dict(...)`` of the whole
``train_step``). :func:`compile_backbone`, :class:`CompileBackboneHook` (``custom_hooks``)
and :func:`add_compile_hook` (``--compile``) replace their ``forward`` in place: state
dicts and module hooks are unchanged. How sizes compile: docs/deployment.md ("Sizes").
"""

import functools
import logging
import weakref
from typing import List, Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from mmcirc.utils.model_parts import image_backbone

__all__ = [
    'DYNAMIC',
    'CompileBackboneHook',
    'add_compile_hook',
    'check_compile_options',
    'compile_backbone',
    'compiled_graphs',
    'is_compiled',
]

#: the ``dynamic`` values :func:`compile_backbone` takes (torch.compile's)
DYNAMIC = (None, True, False)
#: the modules :func:`compile_backbone` compiled
_COMPILED = weakref.WeakSet()


def check_compile_options(backend='inductor', mode=None, dynamic=None) -> None:
    """One-line ``ValueError`` naming the argument unless ``backend`` is a torch.compile
    backend, ``mode`` one of its modes (None: the default) and ``dynamic`` one of
    :data:`DYNAMIC`; torch's own checks of the three, before anything is compiled."""
    import torch

    backends = torch.compiler.list_backends(exclude_tags=())
    if backend not in backends:
        raise ValueError(
            f'backend must be a torch.compile backend such as '
            f'{tuple(torch.compiler.list_backends())}, got {backend!r}'
        )
    if dynamic not in DYNAMIC:
        raise ValueError(f'dynamic must be one of {DYNAMIC}, got {dynamic!r}')
    if mode is not None:
        try:  # torch.compile checks the mode when it wraps a function
            torch.compile(abs, backend=backend, mode=mode)
        except RuntimeError as err:
            raise ValueError(f'mode: {str(err).splitlines()[0]}') from None


def is_compiled(module) -> bool:
    """Whether :func:`compile_backbone` compiled ``module``'s forward."""
    return module in _COMPILED


def _parts(model, neck: bool):
    model = model.module if is_model_wrapper(model) else model
    parts = [('backbone', image_backbone(model))]
    part = getattr(model, 'neck', None) if neck else None
    if part is not None and callable(getattr(type(part), 'forward', None)):
        parts.append(('neck', part))
    return parts


def _backend_args(backend, mode, device) -> dict:
    """torch.compile's ``backend`` and ``mode`` arguments; for inductor the mode's options
    with ``strict_output_strides``: a view the graph returns or keeps for the backward
    has eager's strides, which inductor otherwise orders by comparing symbolic strides
    (``64*(W//4)`` against ``64`` after a size change), a comparison it cannot decide.
    On the CPU (``device``) also without inductor's layout optimization, which turns the
    convolutions channels-last and makes mkldnn's forward and backward slower than
    eager's layout."""
    if backend != 'inductor':
        return dict(backend=backend, mode=mode)
    from torch._inductor import list_mode_options

    options = {**list_mode_options(mode or 'default'), 'strict_output_strides': True}
    if device == 'cpu':
        options['layout_optimization'] = False
    return dict(backend=backend, options=options)


def _mark_sizes_dynamic(values) -> None:
    """Mark the height and width of every 4-D tensor in ``values`` (and in lists and
    tuples of them) that takes the CUDA layout (:func:`mmcirc.ops.settings.cpu_layout`)
    dynamic (``maybe_mark_dynamic``: a size the code specializes stays static, without
    an error)."""
    import torch

    from mmcirc.ops.settings import cpu_layout

    for v in values:
        if isinstance(v, (list, tuple)):
            _mark_sizes_dynamic(v)
        elif isinstance(v, torch.Tensor) and v.dim() == 4 and not cpu_layout(v):
            torch._dynamo.maybe_mark_dynamic(v, 2)
            torch._dynamo.maybe_mark_dynamic(v, 3)


def _recompile_limit_errors() -> tuple:
    """What torch.compile raises for a fullgraph part past its recompile limit."""
    from torch._dynamo import exc

    names = ('FailOnRecompileLimitHit', 'FailOnCacheLimitHit')
    return tuple(getattr(exc, n) for n in names if hasattr(exc, n))


def _sizes(args) -> str:
    import torch

    return ', '.join(
        'x'.join(str(int(n)) for n in a.shape[-2:])
        for a in args
        if isinstance(a, torch.Tensor) and a.dim() == 4
    )


class _QuietRecompileLimit(logging.Filter):
    """Drops dynamo's own (multi-line, once per size) recompile-limit warning during the
    calls of :func:`_guarded_forward`'s parts, which say it in one line."""

    active = 0

    def filter(self, record):
        return not (self.active and 'recompile_limit' in record.getMessage())


_QUIET = _QuietRecompileLimit()


def _guarded_forward(name, eager, compiled, mark: bool, logger, fullgraph=True):
    """``compiled`` with the input's sizes marked dynamic (``mark``) and, where a
    ``fullgraph`` compile refuses one more graph (the recompile limit), ``eager`` instead,
    said once in one warning line through ``logger`` (mmengine's ``print_log``; without
    ``fullgraph`` torch runs the frame eagerly itself, with its own warning)."""
    limit_errors = _recompile_limit_errors()
    said = []
    quiet = 1 if fullgraph else 0
    dynamo_log = logging.getLogger('torch._dynamo.convert_frame')
    if fullgraph and _QUIET not in dynamo_log.filters:
        dynamo_log.addFilter(_QUIET)

    @functools.wraps(eager)
    def forward(*args, **kwargs):
        if mark:
            _mark_sizes_dynamic(args)
        _QUIET.active += quiet
        try:
            return compiled(*args, **kwargs)
        except limit_errors:
            if not said:
                said.append(True)
                import torch

                limit = getattr(torch._dynamo.config, 'recompile_limit', None)
                print_log(
                    f"compile: the {name} reached torch.compile's recompile limit ({limit}) "
                    f'at input {_sizes(args) or "size"}; sizes without a compiled graph run '
                    'it eagerly from here (torch._dynamo.config.recompile_limit raises the limit)',
                    logger=logger,
                    level=logging.WARNING,
                )
        finally:
            _QUIET.active -= quiet
        return eager(*args, **kwargs)

    return forward


def compile_backbone(
    model, backend='inductor', mode=None, dynamic=None, neck=True, fullgraph=True, logger='current'
) -> List[str]:
    """Compile the forward of ``model``'s image backbone and, with ``neck``, of its neck
    (a model wrapper's module), each with ``torch.compile(fullgraph=fullgraph)`` and
    ``backend``, ``mode``, ``dynamic`` (sizes marked dynamic unless ``dynamic=False``, past
    the recompile limit eager: :func:`_guarded_forward`; ``logger``: ``print_log``'s); the
    rest of the model stays eager. A part already compiled is left as it is; each part's
    options follow the device of its parameters (:func:`_backend_args`), so move the
    model first. Returns the names of the parts compiled (``'backbone'``, ``'neck'``)."""
    import torch

    check_compile_options(backend, mode, dynamic)
    done = []
    for name, part in _parts(model, neck):
        if is_compiled(part):
            continue
        device = next(part.parameters(), torch.empty(0)).device.type
        args = _backend_args(backend, mode, device)
        eager = part.forward
        compiled = torch.compile(eager, dynamic=dynamic, fullgraph=fullgraph, **args)
        mark = dynamic is not False
        part.forward = _guarded_forward(name, eager, compiled, mark, logger, fullgraph)
        _COMPILED.add(part)
        done.append(name)
    return done


def compiled_graphs() -> int:
    """The graphs torch.compile has compiled in this process (``torch._dynamo``'s count;
    a recompile is one more)."""
    from torch._dynamo.utils import counters

    return counters['stats']['unique_graphs']


@HOOKS.register_module()  # mmengine's root: mmdet/mmseg/mmpretrain HOOKS find it there
class CompileBackboneHook(Hook):
    """Compile the model's backbone and neck (:func:`compile_backbone`) before training,
    validation or testing; the heads, losses and assigners stay eager.

    Args:
        backend (str): torch.compile backend. Defaults to ``'inductor'``.
        mode (str, optional): torch.compile mode (``'reduce-overhead'``: CUDA graphs).
        dynamic (bool, optional): torch.compile's symbolic sizes (see the module).
        neck (bool): compile the neck too. Defaults to True.

    After each training iteration but the first it logs a warning when that iteration
    compiled a new graph (a changed input size, batch size or mode); ``recompiles``
    counts those graphs.
    """

    def __init__(self, backend='inductor', mode=None, dynamic=None, neck=True):
        if not isinstance(neck, bool):
            raise TypeError(f'CompileBackboneHook: neck must be True or False, got {neck!r}')
        try:
            check_compile_options(backend, mode, dynamic)
        except ValueError as err:
            raise ValueError(f'CompileBackboneHook: {err}') from None
        self.kwargs = dict(backend=backend, mode=mode, dynamic=dynamic, neck=neck)
        self.recompiles = 0
        self._before: Optional[int] = None
        self._first_done = False

    def before_train(self, runner):
        done = compile_backbone(runner.model, **self.kwargs, logger=runner.logger)
        if done:
            runner.logger.info(
                f'CompileBackboneHook: compiled the {" and the ".join(done)} '
                f'(fullgraph, backend {self.kwargs["backend"]!r}); the heads run eagerly'
            )

    before_val = before_test = before_train

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._before = compiled_graphs()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        new = compiled_graphs() - self._before
        if new and self._first_done:  # the first iteration compiles
            self.recompiles += new
            runner.logger.warning(
                f'CompileBackboneHook: iteration {runner.iter + 1} compiled {new} new '
                f'graph(s) ({self.recompiles} after the first iteration): a new input size, '
                'batch size or mode'
            )
        self._first_done = True


def add_compile_hook(cfg, backend='inductor') -> None:
    """``cfg`` (an mmengine Config) with a :class:`CompileBackboneHook` of ``backend`` in
    its ``custom_hooks``: the config's own one gets that backend, else one is added."""
    check_compile_options(backend)
    hooks = list(cfg.get('custom_hooks') or [])
    for hook in hooks:
        if hook.get('type') in ('CompileBackboneHook', CompileBackboneHook):
            hook['backend'] = backend
            break
    else:
        hooks.append(dict(type='CompileBackboneHook', backend=backend))
    cfg.custom_hooks = hooks
