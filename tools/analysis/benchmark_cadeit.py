"""DeiT against CA-DeiT (circulant attention) across resolutions: the paper's
isotropic reference point (CA-DeiT-T about 7x faster than DeiT-T at 1536 x 1536,
RTX 3090).

    python tools/analysis/benchmark_cadeit.py [--models deit_t ca_deit_t]
        [--sizes 224 512 1024 1536 2048] [--device cuda|cpu] [--amp bf16|fp16]
        [--batch 1] [--repeat 10] [--flops] [--out-dir DIR]

Both models are timm's ``VisionTransformer`` (patch 16; T: width 192, 12 blocks, 3
heads; S: 384, 12, 6) with ``dynamic_img_size`` so that any input size runs:

* ``deit_*``: timm's DeiT as is (class token, learned position embedding resampled to
  the input's grid, fused SDPA attention);
* ``ca_deit_*``: the official CA-DeiT layout on the same timm parts: no class token,
  no position embedding, average pooling, and per block ``x + CPE(x)`` (3x3 depthwise
  conv) before ``x + CA(LN(x))`` with mmcirc's ``CirculantAttention`` (d = 1).

Needs torch and timm only (``pip install timm``); ``--flops`` also needs mmengine
(the FLOP counter of ``mmcirc.analysis``, which counts the FFTs and SDPA). Time:
median of ``--repeat`` forwards after two warm-ups (batch ``--batch``, no grad,
eval mode); memory (CUDA only): ``max_memory_allocated`` of one forward above the
allocation before it. Writes ``results_<device>[_<amp>].json`` and a markdown table
to ``--out-dir`` (default ``work_dirs/benchmark_cadeit``).
"""

import argparse
import contextlib
import importlib.util
import json
import os
import os.path as osp
import statistics
import sys
import time

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
#: name -> (width, heads, circulant?)
MODELS = {
    'deit_t': (192, 3, False),
    'ca_deit_t': (192, 3, True),
    'deit_s': (384, 6, False),
    'ca_deit_s': (384, 6, True),
}
LABELS = {
    'deit_t': 'DeiT-T',
    'ca_deit_t': 'CA-DeiT-T',
    'deit_s': 'DeiT-S',
    'ca_deit_s': 'CA-DeiT-S',
}


def _load_ops():
    """mmcirc.ops on its own (torch only; works without OpenMMLab installed)."""
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    import mmcirc.ops

    return mmcirc.ops


def build(name):
    """timm DeiT (``deit_*``) or CA-DeiT (``ca_deit_*``), eval mode."""
    import torch
    from torch import nn

    try:
        from timm.models.vision_transformer import VisionTransformer
    except ImportError:
        sys.exit('benchmark_cadeit.py needs timm: pip install timm')
    width, heads, circulant = MODELS[name]
    common = dict(
        img_size=224,
        patch_size=16,
        embed_dim=width,
        depth=12,
        num_heads=heads,
        dynamic_img_size=True,
    )
    if not circulant:
        return VisionTransformer(**common).eval()
    vit = VisionTransformer(**common, class_token=False, global_pool='avg', pos_embed='none')
    ops = _load_ops()
    for blk in vit.blocks:
        blk.attn = ops.CirculantAttention(width)  # d = 1: one head per channel
        blk.cpe = nn.Conv2d(width, width, 3, padding=1, groups=width)

    class CADeiT(nn.Module):
        """timm ViT parts in the CA-DeiT block order (CPE, CA, MLP)."""

        def __init__(self, vit):
            super().__init__()
            self.vit = vit

        def forward(self, img):
            x = self.vit.patch_embed(img)  # (B, H, W, C): dynamic_img_size gives NHWC
            b, h, w, c = map(int, x.shape)  # plain ints also while jit-tracing (--flops)
            x = x.reshape(b, h * w, c)  # (B, N, C)
            for blk in self.vit.blocks:
                grid = x.transpose(1, 2).reshape(b, c, h, w)  # (B, C, H, W)
                x = x + blk.cpe(grid).flatten(2).transpose(1, 2)  # (B, N, C)
                x = x + blk.drop_path1(blk.ls1(blk.attn(blk.norm1(x), (h, w))))
                x = x + blk.drop_path2(blk.ls2(blk.mlp(blk.norm2(x))))
            return self.vit.forward_head(self.vit.norm(x))  # (B, classes)

    return CADeiT(vit).eval()


def measure(name, size, args):
    """{'time_ms', 'runs', 'peak_mb', 'finite'} of one model at one input size."""
    import torch

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = build(name).to(device)
    img = torch.randn(args.batch, 3, size, size, device=device)
    dtype = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(args.amp)
    amp = torch.autocast(device.type, dtype=dtype) if args.amp else contextlib.nullcontext()

    def forward():
        with torch.no_grad(), amp:
            out = model(img)
        if device.type == 'cuda':
            torch.cuda.synchronize()
        return out

    res = {}
    try:
        out = forward()  # warm-up (cuFFT plans, kernels)
        res['finite'] = bool(out.float().isfinite().all())
        forward()
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            forward()
            times.append(time.perf_counter() - t)
        res.update(time_ms=1e3 * statistics.median(times), runs=len(times))
        if device.type == 'cuda':
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            forward()
            res['peak_mb'] = (torch.cuda.max_memory_allocated() - base) / 2**20
    except torch.OutOfMemoryError:
        res = {'error': 'out of memory'}
    if args.flops and 'error' not in res:
        from mmcirc.analysis import count_flops

        res['gmacs'] = count_flops(model.cpu(), img[:1].cpu()) / 1e9
    del model, img
    if device.type == 'cuda':
        torch.cuda.empty_cache()
    return res


def table(results, args, device_name):
    lines = [
        f'Device: {device_name}; batch {args.batch}; '
        f'{args.amp + " autocast" if args.amp else "float32"}; forward, no grad. '
        'Speed-up: the DeiT of the same width at the same size over the CA-DeiT.',
        '',
        '| size | model | time (ms) | peak mem (MiB) | GMACs | speed-up |',
        '|---:|---|---:|---:|---:|---:|',
    ]
    for size in args.sizes:
        for name in args.models:
            r = results.get(f'{name}|{size}', {})
            base = results.get(f'{name[3:]}|{size}', {}) if name.startswith('ca_') else {}
            cell = lambda k, f: f.format(r[k]) if k in r else '-'
            speed = (
                f'{base["time_ms"] / r["time_ms"]:.2f}x'
                if 'time_ms' in base and 'time_ms' in r
                else '-'
            )
            lines.append(
                f'| {size} | {LABELS[name]} | '
                f'{r.get("error") or cell("time_ms", "{:.1f}")} | '
                f'{cell("peak_mb", "{:.0f}")} | {cell("gmacs", "{:.1f}")} | {speed} |'
            )
    return '\n'.join(lines) + '\n'


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--models', nargs='+', default=['deit_t', 'ca_deit_t'], choices=list(MODELS))
    p.add_argument('--sizes', nargs='+', type=int, default=[224, 512, 1024, 1536, 2048])
    p.add_argument('--device', default=None, help='cuda or cpu (default: cuda if present)')
    p.add_argument(
        '--amp',
        choices=['bf16', 'fp16'],
        default=None,
        help='run under torch.autocast with this dtype',
    )
    p.add_argument('--batch', type=int, default=1)
    p.add_argument('--repeat', type=int, default=10, help='timed forwards')
    p.add_argument('--flops', action='store_true', help='count MACs (needs mmengine)')
    p.add_argument('--out-dir', default=osp.join(ROOT, 'work_dirs', 'benchmark_cadeit'))
    args = p.parse_args(argv)
    for opt in ('batch', 'repeat'):
        if getattr(args, opt) < 1:
            p.error(f'--{opt} must be >= 1, got {getattr(args, opt)}')
    if any(s < 16 or s % 16 for s in args.sizes):
        p.error(f'--sizes must be multiples of the patch size 16, got {args.sizes}')
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch

    if importlib.util.find_spec('timm') is None:
        sys.exit('benchmark_cadeit.py needs timm: pip install timm')
    if args.flops and importlib.util.find_spec('mmengine') is None:
        sys.exit('--flops needs mmengine (the FLOP counter of mmcirc.analysis)')
    args.device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if args.device == 'cuda' and not torch.cuda.is_available():
        sys.exit('--device cuda: CUDA is not available')
    device_name = (
        f'cuda ({torch.cuda.get_device_name()}, torch {torch.__version__})'
        if args.device == 'cuda'
        else f'cpu ({torch.get_num_threads()} threads)'
    )
    results = {}
    for size in args.sizes:
        for name in args.models:
            r = results[f'{name}|{size}'] = measure(name, size, args)
            print(
                f'[{size}] {LABELS[name]}: '
                + (
                    r.get('error')
                    or (
                        f'{r["time_ms"]:.1f} ms'
                        + (f', {r["peak_mb"]:.0f} MiB' if 'peak_mb' in r else '')
                        + (f', {r["gmacs"]:.1f} GMACs' if 'gmacs' in r else '')
                        + ('' if r['finite'] else ', NON-FINITE OUTPUT')
                    )
                ),
                flush=True,
            )
    text = table(results, args, device_name)
    os.makedirs(args.out_dir, exist_ok=True)
    stem = f'{args.device}' + (f'_{args.amp}' if args.amp else '')
    with open(osp.join(args.out_dir, f'results_{stem}.json'), 'w') as f:
        json.dump(
            dict(device=device_name, amp=args.amp, batch=args.batch, results=results), f, indent=1
        )
    with open(osp.join(args.out_dir, f'table_{stem}.md'), 'w') as f:
        f.write(text)
    print('\n' + text)


if __name__ == '__main__':
    main()
