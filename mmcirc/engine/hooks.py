"""Training hooks."""

import random

from mmengine.dist import broadcast_object_list, get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


def core_count_choices(max_cores):
    """{1, 2, 4, ...} up to ``max_cores``, plus ``max_cores`` itself."""
    return [1 << i for i in range(max_cores.bit_length()) if 1 << i < max_cores] + [max_cores]


def official_budgets(max_cores, chunk=8, weights=None):
    """``(budgets, weights)`` of VECA's nested schedule: the multiples of ``chunk`` up
    to ``max_cores`` and their weights (default ceil(i / 2) for the i-th, i.e.
    1, 1, 2, 2, 3, 3, 4, 4 for 64 cores in chunks of 8)."""
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f'NestedCoreHook: chunk must be a positive int, got {chunk!r}')
    if max_cores % chunk:
        raise ValueError(
            f'NestedCoreHook: with the official schedule max_cores must be a multiple of '
            f'chunk={chunk} (budgets {chunk}, {2 * chunk}, ...), got {max_cores!r}'
        )
    budgets = list(range(chunk, max_cores + 1, chunk))
    weights = [(i + 2) // 2 for i in range(len(budgets))] if weights is None else list(weights)
    if len(weights) != len(budgets) or not all(
        isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0 for w in weights
    ):
        raise ValueError(
            f'NestedCoreHook: budget_weights must be {len(budgets)} positive numbers '
            f'(one per budget {budgets}), got {weights!r}'
        )
    return budgets, weights


@HOOKS.register_module()  # mmengine's root: mmdet/mmseg/mmpretrain HOOKS find it there
class NestedCoreHook(Hook):
    """Nested core training (METHOD.md, section 2): a new active core count per iteration.

    Before each training iteration C' is drawn as ``max_cores`` with probability
    ``p_max``, otherwise uniformly from {1, 2, 4, ...} up to ``max_cores``, and set on
    every module of the model that has ``set_num_cores``. Rank 0 draws and broadcasts,
    so all ranks of a distributed run use the same C'. Validation and testing run with
    ``eval_num_cores`` if given, else with the count the model was built with (its
    ``num_cores`` argument, so ``--cfg-options model.backbone.num_cores=8`` picks the
    test-time C' without retraining).

    Args:
        max_cores (int): C_max, the size of the core banks.
        p_max (float): probability of using all cores. Defaults to 0.5.
        eval_num_cores (int, optional): C' for validation/test; None keeps the
            model's configured count.
        seed (int, optional): seed of the sampler (rank 0).
        schedule (str): ``'pow2'`` (default, above) or ``'official'`` (the released VECA
            models, METHOD.md 3.2: C' drawn from :func:`official_budgets`, no ``p_max``).
        chunk (int): budget granularity of the official schedule (8).
        budget_weights (Sequence[float], optional): one positive weight per budget
            of the official schedule.
    """

    SCHEDULES = ('pow2', 'official')

    def __init__(
        self,
        max_cores,
        p_max=0.5,
        eval_num_cores=None,
        seed=None,
        schedule='pow2',
        chunk=8,
        budget_weights=None,
    ):
        if not isinstance(max_cores, int) or max_cores < 1:
            raise ValueError(f'NestedCoreHook: max_cores must be an int >= 1, got {max_cores!r}')
        if not 0.0 <= p_max <= 1.0:
            raise ValueError(f'NestedCoreHook: p_max must be in [0, 1], got {p_max!r}')
        if eval_num_cores is not None and not 1 <= eval_num_cores <= max_cores:
            raise ValueError(
                f'NestedCoreHook: eval_num_cores must be in [1, {max_cores}], '
                f'got {eval_num_cores!r}'
            )
        if schedule not in self.SCHEDULES:
            raise ValueError(
                f'NestedCoreHook: schedule must be one of {self.SCHEDULES}, got {schedule!r}'
            )
        self.max_cores, self.p_max, self.eval_num_cores = max_cores, p_max, eval_num_cores
        self.schedule = schedule
        self.choices = core_count_choices(max_cores)
        self.weights = None
        if schedule == 'official':
            self.choices, self.weights = official_budgets(max_cores, chunk, budget_weights)
            if eval_num_cores is not None and eval_num_cores not in self.choices:
                raise ValueError(
                    f'NestedCoreHook: with the official schedule eval_num_cores must be one of '
                    f'{self.choices}, got {eval_num_cores!r}'
                )
        self.rng = random.Random(seed)
        self.current = max_cores
        self.configured = None  # the model's own count, read before training starts

    def sample(self):
        """Draw C' (on this process; use :meth:`sample_synced` in a run)."""
        if self.weights is not None:
            return self.rng.choices(self.choices, weights=self.weights)[0]
        if self.rng.random() < self.p_max:
            return self.max_cores
        return self.rng.choice(self.choices)

    def sample_synced(self):
        """Draw C' on rank 0 and give every rank the same value."""
        value = [self.sample() if get_rank() == 0 else None]
        broadcast_object_list(value, src=0)
        return value[0]

    @staticmethod
    def elastic_modules(model):
        """The modules of ``model`` that take a core count (``set_num_cores``)."""
        model = model.module if is_model_wrapper(model) else model
        targets = [m for m in model.modules() if hasattr(m, 'set_num_cores')]
        if not targets:
            raise RuntimeError(
                'NestedCoreHook: the model has no module with set_num_cores; '
                'use it with a core-attention backbone (CorePVT, CoreSwin)'
            )
        return targets

    def set_num_cores(self, model, num_cores):
        for module in self.elastic_modules(model):
            module.set_num_cores(num_cores)

    def before_train(self, runner):
        self.configured = getattr(self.elastic_modules(runner.model)[0], 'num_cores', None)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.current = self.sample_synced()
        self.set_num_cores(runner.model, self.current)

    def _evaluate_with(self, runner, mode):
        num_cores = self.eval_num_cores or self.configured
        if num_cores is not None:
            self.set_num_cores(runner.model, num_cores)
        active = getattr(self.elastic_modules(runner.model)[0], 'num_cores', num_cores)
        runner.logger.info(f'NestedCoreHook: {mode} with {active} active cores')

    def before_val(self, runner):
        self._evaluate_with(runner, 'validating')

    def before_test(self, runner):
        self._evaluate_with(runner, 'testing')

    def after_val(self, runner):
        self.set_num_cores(runner.model, self.current)
