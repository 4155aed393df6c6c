"""Suite ``kernel``: the Triton kernel of circulant attention's core against the FFT path
and softmax attention (SDPA, flash), one attention layer on S x S token maps.

Layers (width ``--dim``, default 192: CA-DeiT-T's), on tokens (B, S*S, C):

* ``sdpa``: :class:`~mmcirc.benchmark.baselines.SDPASelfAttention` with DeiT-T's heads of 64
  (flash pinned under bf16 / fp16 on CUDA);
* ``fft``: :class:`~mmcirc.ops.CirculantAttention` (d = 1), ``kernel='torch'``;
* ``kernel-ieee`` / ``kernel-tf32``: the same weights with ``kernel='triton'``, ``tl.dot``
  in float32 (``'ieee'``) or TF32 (:func:`~mmcirc.ops.circulant_kernel.set_precision`).

Each (size, mode) times its layers round-robin (:func:`~mmcirc.benchmark.measurement.
round_robin`: median of ``--repeat`` calls after three warm-ups, synchronised), eager,
under the autocast of ``--precision`` (default bf16); ``forward`` in eval mode without
gradients, ``train`` forward and backward. The error of each circulant layer is the
largest difference of its forward from the layer in float64 (the FFT path, tested against
the dense reference) on the same input, over the largest value of that reference.

On the CPU (``--device cpu``) the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``,
set here before the kernel is first used): a rehearsal of the code paths at tiny sizes,
not a timing. Writes ``results_<device>.json`` and ``table_<device>.md`` in ``--out-dir``
after every size.
"""

import copy
import os
import os.path as osp

from ..measurement import PRECISIONS, make_step, round_robin
from ..report import ResultStore, environment, markdown_table

LAYERS = ('sdpa', 'fft', 'kernel-ieee', 'kernel-tf32')
MODES = ('forward', 'train')
DEFAULT_SIZES = [14, 32, 64]
SDPA_HEAD = 64


def _layers(dim):
    import torch

    from mmcirc.benchmark.baselines import SDPASelfAttention
    from mmcirc.ops import CirculantAttention

    torch.manual_seed(0)
    fft = CirculantAttention(dim, kernel='torch')
    tri = copy.deepcopy(fft)
    tri.kernel = 'triton'
    sdpa = SDPASelfAttention(dim, max(1, dim // SDPA_HEAD))
    return dict(sdpa=sdpa, fft=fft, kernel=tri)


def _call(layers, name, hw):
    from mmcirc.ops import circulant_kernel

    if name == 'sdpa':
        return layers['sdpa'], layers['sdpa']
    if name == 'fft':
        return layers['fft'], lambda x: layers['fft'](x, hw)
    layer, precision = layers['kernel'], name.split('-')[1]

    def call(x):
        circulant_kernel.set_precision(precision)
        return layer(x, hw)

    return layer, call


def errors(layers, x, hw, precision):
    """{layer: error of its forward} against the FFT path in float64 (see the docstring)."""
    import contextlib

    import torch

    dtype = PRECISIONS[precision]
    autocast = (
        torch.autocast(x.device.type, dtype=getattr(torch, dtype))
        if dtype
        else contextlib.nullcontext()
    )
    ref_layer = copy.deepcopy(layers['fft']).double().eval()
    with torch.no_grad():
        ref = ref_layer(x.double(), hw)
        out = {}
        for name in LAYERS[1:]:
            layer, call = _call(layers, name, hw)
            layer.eval()
            with autocast:
                y = call(x)
            out[name] = ((y.double() - ref).abs().max() / ref.abs().max()).item()
    return out


def table(results) -> str:
    head = ['map', 'mode'] + [f'{n} ms' for n in LAYERS] + [f'{n} error' for n in LAYERS[1:]]
    rows = []
    for r in results.values():
        t, e = r['times_ms'], r.get('errors', {})
        rows.append(
            [f'{r["size"]} x {r["size"]}', r['mode']]
            + [f'{t[n]:.3f}' if t.get(n) is not None else '-' for n in LAYERS]
            + [f'{e[n]:.1e}' if n in e else '-' for n in LAYERS[1:]]
        )
    return markdown_table(head, rows, 'll' + 'r' * (len(head) - 2)) + '\n'


def run(options, command: str):
    """Every size and mode (``options``: the flags of ``python -m mmcirc.benchmark kernel``)."""
    import torch

    from mmcirc.utils.fileio import atomic_write

    device = options.device
    if torch.device(device).type == 'cpu':
        os.environ['TRITON_INTERPRET'] = '1'  # read when the kernel is defined
    store = ResultStore(osp.join(options.out_dir, f'results_{device}.json'))
    env = environment(command, device=device)
    layers = {k: m.to(device) for k, m in _layers(options.dim).items()}
    text = ''
    for size in options.sizes:
        hw = (size, size)
        x = torch.randn(options.batch, size * size, options.dim, device=device)
        if layers['kernel']._plan(x, hw)[-1] is None:
            raise RuntimeError(f'the Triton kernel does not run on {device} at {size} x {size}')
        errs = errors(layers, x, hw, options.precision)
        for mode in MODES:
            steps = {}
            for name in LAYERS:
                layer, call = _call(layers, name, hw)
                steps[name] = make_step(
                    layer,
                    call,
                    x.clone(),
                    device=device,
                    precision=options.precision,
                    backward=mode == 'train',
                    flash=name == 'sdpa',
                )
            res = round_robin(steps, repeat=options.repeat, warmup=3, record_errors=True)
            times = {n: r.get('time_ms') for n, r in res.items()}
            rec = dict(size=size, mode=mode, batch=options.batch, dim=options.dim)
            rec.update(precision=options.precision, times_ms=times, errors=errs)
            store.update({f'{size}|{mode}': rec})
            print(f'{size} x {size} {mode}: {times} errors {errs}', flush=True)
        text = table(store.results)
        store.save(environment=env)
        atomic_write(osp.join(options.out_dir, f'table_{device}.md'), text)
    print('\n' + text)
    return store.results
