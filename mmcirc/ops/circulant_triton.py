"""The attention core of circulant attention in one Triton program per (batch, head) map:
Eq. 15, the softmax and Eq. 16 with the 2-D DFTs as matrix products (METHOD.md, 'One
kernel'), forward and backward. Called by the custom op of
:mod:`mmcirc.ops.circulant_kernel`, which imports this file on its first call (with
``TRITON_INTERPRET=1`` in the environment by then, the kernels run in Triton's
interpreter on CPU tensors).

A program loads the d channels of its head from tokens (B, N, C) (row-major H x W map,
any strides shared by q, k, v and the gate), zero padded to a tile (T1, T2) of powers of
two holding the DFT grid (P1, P2): the map itself (``'circular'``) or exactly
(2H-1) x (2W-1) (``'zero'``, on which the correlations do not wrap). The cos / sin
matrices of the grid are built in the program; a 2-D DFT of a real tile is 6 products
(:func:`_dft2`), the real part of an inverse 6 (:func:`_idft2`). Tile cells outside the
grid are zero in every spectrum and masked out of the softmax. Everything is float32
(``tl.dot`` with ``PREC``: ``'ieee'`` or ``'tf32'``); the output is cast to its tensor's
dtype. Only builtins of ``triton.language`` and the helpers here are called (not its
``@jit`` library functions such as ``tl.sum``): the helpers are defined when this file is
imported, so in the interpreter they are interpreted even where triton itself was imported
before ``TRITON_INTERPRET`` was set.

With ``a[m] = s sum_c sum_i q_c[i] k_c[i+m]``, ``p = softmax(a)``,
``o~_c[i] = sum_m p[m] v_c[i+m]``, ``Z[i] = sum_m p[m] [i+m in the map]`` (``'zero'``;
1 for ``'circular'``), ``o_c = o~_c / Z`` and ``y_c = o_c silu(g_c)`` (no gate: y = o),
the spectra are ``FFT(a) = s sum_c conj(Q_c) K_c`` and ``FFT(o~_c) = conj(P) V_c``; the
backward recomputes p from q and k (no per-offset tensor is kept between the passes) and
uses ``FFT(dv_c) = P DO~_c``, ``FFT(dp) = sum_c conj(DO~_c) V_c`` (plus the box sums of
dZ), ``FFT(dq_c) = s conj(DA) K_c`` and ``FFT(dk_c) = s DA Q_c``. Z and dZ's term are
box sums over the offsets, two products each with 0/1 band matrices (:func:`_box`).

This file needs torch and triton.
"""

import triton
import triton.language as tl

__all__ = ['backward', 'forward', 'interpreted', 'tile']

TWO_PI = 6.283185307179586


def tile(n):
    """The tile side holding ``n`` grid cells: a power of two, at least 16 (``tl.dot``)."""
    return max(16, triton.next_power_of_2(n))


@triton.jit
def _dft_mats(P, T: tl.constexpr):
    """cos and sin of 2 pi u j / P, (T, T), zero outside the P x P grid (u j reduced mod
    P in integers: every angle in [0, 2 pi))."""
    u = tl.arange(0, T)[:, None]
    j = tl.arange(0, T)[None, :]
    ang = ((u * j) % P).to(tl.float32) * (TWO_PI / P)
    ok = (u < P) & (j < P)
    return tl.where(ok, tl.cos(ang), 0.0), tl.where(ok, tl.sin(ang), 0.0)


@triton.jit
def _box(P, n, T: tl.constexpr, TRANS: tl.constexpr):
    """The 0/1 matrix M[i, g] = [i < n and the offset g (mod P, P = 2n - 1) keeps token i
    inside the map]: ``Z = M_H p M_W^T`` are the row masses; (T, T), transposed with
    ``TRANS``."""
    if TRANS:
        g = tl.arange(0, T)[:, None]
        i = tl.arange(0, T)[None, :]
    else:
        i = tl.arange(0, T)[:, None]
        g = tl.arange(0, T)[None, :]
    r = (g + n - 1) % P  # the offset m = g (mod P) plus n - 1, in [0, 2n - 2]
    return ((i < n) & (g < P) & (r >= n - 1 - i) & (r <= 2 * n - 2 - i)).to(tl.float32)


@triton.jit
def _dft2(x, C1, S1, C2, S2, PREC: tl.constexpr):
    """(real, imag) of the 2-D DFT of a real tile x: (C1 - i S1) x (C2 - i S2)."""
    wr = tl.dot(x, C2, input_precision=PREC)
    wi = -tl.dot(x, S2, input_precision=PREC)
    xr = tl.dot(C1, wr, input_precision=PREC) + tl.dot(S1, wi, input_precision=PREC)
    xi = tl.dot(C1, wi, input_precision=PREC) - tl.dot(S1, wr, input_precision=PREC)
    return xr, xi


@triton.jit
def _idft2(yr, yi, C1, S1, C2, S2, PREC: tl.constexpr):
    """Re[(C1 + i S1) y (C2 + i S2)]: the unnormalised real inverse DFT of a spectrum."""
    zr = tl.dot(yr, C2, input_precision=PREC) - tl.dot(yi, S2, input_precision=PREC)
    zi = tl.dot(yr, S2, input_precision=PREC) + tl.dot(yi, C2, input_precision=PREC)
    return tl.dot(C1, zr, input_precision=PREC) - tl.dot(S1, zi, input_precision=PREC)


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _greater(a, b):
    return tl.maximum(a, b)


@triton.jit
def _sum2(x):
    return tl.reduce(tl.reduce(x, 1, _add), 0, _add)


@triton.jit
def _max2(x):
    return tl.reduce(tl.reduce(x, 1, _greater), 0, _greater)


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _weights(q_ptr, k_ptr, base, sc, sn, H, W, P1, P2, D, scale, C1, S1, C2, S2,
             T1: tl.constexpr, T2: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Eq. 15 and the softmax of one head: p (T1, T2) on the grid, zero off it."""
    i1 = tl.arange(0, T1)[:, None]
    i2 = tl.arange(0, T2)[None, :]
    inmap = (i1 < H) & (i2 < W)
    tok = (i1 * W + i2) * sn
    sr = tl.full((T1, T2), 0.0, tl.float32)
    si = tl.full((T1, T2), 0.0, tl.float32)
    for c in range(D):
        off = base + c * sc + tok
        q = tl.load(q_ptr + off, mask=inmap, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + off, mask=inmap, other=0.0).to(tl.float32)
        qr, qi = _dft2(q, C1, S1, C2, S2, PREC)
        kr, ki = _dft2(k, C1, S1, C2, S2, PREC)
        sr += qr * kr + qi * ki  # conj(Q) K
        si += qr * ki - qi * kr
    a = _idft2(sr, si, C1, S1, C2, S2, PREC) * (scale / (P1 * P2))
    a = tl.where((i1 < P1) & (i2 < P2), a, float('-inf'))
    e = tl.exp(a - _max2(a))
    return e / _sum2(e)


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, o_ptr, sb, sn, sc, gb, gn, gc,
                H, W, P1, P2, HEADS, D, scale, T1: tl.constexpr, T2: tl.constexpr,
                ZERO: tl.constexpr, GATE: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    b = (pid // HEADS).to(tl.int64)
    c0 = (pid % HEADS) * D
    base = b * sb + c0 * sc
    obase = b * H * W * HEADS * D + c0  # the output: contiguous (B, N, C)
    C1, S1 = _dft_mats(P1, T1)
    C2, S2 = _dft_mats(P2, T2)
    p = _weights(q_ptr, k_ptr, base, sc, sn, H, W, P1, P2, D, scale, C1, S1, C2, S2, T1, T2, PREC)
    pr, pi = _dft2(p, C1, S1, C2, S2, PREC)
    i1 = tl.arange(0, T1)[:, None]
    i2 = tl.arange(0, T2)[None, :]
    inmap = (i1 < H) & (i2 < W)
    tok = i1 * W + i2
    z = tl.full((T1, T2), P1 * P2, tl.float32)  # the inverse's 1/G, and Z
    if ZERO:
        mh = _box(P1, H, T1, False)
        mw = _box(P2, W, T2, True)
        mass = tl.dot(tl.dot(mh, p, input_precision=PREC), mw, input_precision=PREC)
        z = z * tl.where(inmap, mass, 1.0)
    for c in range(D):
        v = tl.load(v_ptr + base + c * sc + tok * sn, mask=inmap, other=0.0).to(tl.float32)
        vr, vi = _dft2(v, C1, S1, C2, S2, PREC)
        o = _idft2(pr * vr + pi * vi, pr * vi - pi * vr, C1, S1, C2, S2, PREC) / z
        if GATE:
            goff = b * gb + (c0 + c) * gc + tok * gn
            g = tl.load(g_ptr + goff, mask=inmap, other=0.0).to(tl.float32)
            o = o * g * _sigmoid(g)
        out = o_ptr + obase + c + tok * (HEADS * D)
        tl.store(out, o.to(o_ptr.dtype.element_ty), mask=inmap)


@triton.jit
def _bwd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, dy_ptr, dq_ptr, dk_ptr, dv_ptr, dg_ptr,
                sb, sn, sc, gb, gn, gc, H, W, P1, P2, HEADS, D, scale,
                T1: tl.constexpr, T2: tl.constexpr, ZERO: tl.constexpr, GATE: tl.constexpr,
                PREC: tl.constexpr):  # fmt: skip
    pid = tl.program_id(0)
    b = (pid // HEADS).to(tl.int64)
    c0 = (pid % HEADS) * D
    base = b * sb + c0 * sc
    obase = b * H * W * HEADS * D + c0  # dy and the gradients: contiguous (B, N, C)
    C1, S1 = _dft_mats(P1, T1)
    C2, S2 = _dft_mats(P2, T2)
    p = _weights(q_ptr, k_ptr, base, sc, sn, H, W, P1, P2, D, scale, C1, S1, C2, S2, T1, T2, PREC)
    pr, pi = _dft2(p, C1, S1, C2, S2, PREC)
    i1 = tl.arange(0, T1)[:, None]
    i2 = tl.arange(0, T2)[None, :]
    inmap = (i1 < H) & (i2 < W)
    tok = i1 * W + i2
    g_inv = 1.0 / (P1 * P2)
    z = tl.full((T1, T2), 1.0, tl.float32)
    if ZERO:
        mass = tl.dot(tl.dot(_box(P1, H, T1, False), p, input_precision=PREC),
                      _box(P2, W, T2, True), input_precision=PREC)  # fmt: skip
        z = tl.where(inmap, mass, 1.0)
    dpr = tl.full((T1, T2), 0.0, tl.float32)
    dpi = tl.full((T1, T2), 0.0, tl.float32)
    dz = tl.full((T1, T2), 0.0, tl.float32)
    for c in range(D):  # Eq. 16 and the gate backwards; dv
        off = base + c * sc + tok * sn
        goff = obase + c + tok * (HEADS * D)
        v = tl.load(v_ptr + off, mask=inmap, other=0.0).to(tl.float32)
        vr, vi = _dft2(v, C1, S1, C2, S2, PREC)
        do = tl.load(dy_ptr + goff, mask=inmap, other=0.0).to(tl.float32)
        if GATE or ZERO:
            o = _idft2(pr * vr + pi * vi, pr * vi - pi * vr, C1, S1, C2, S2, PREC) * g_inv / z
        if GATE:
            g = tl.load(g_ptr + b * gb + (c0 + c) * gc + tok * gn, mask=inmap, other=0.0)
            g = g.to(tl.float32)
            sg = _sigmoid(g)
            dg = do * o * sg * (1.0 + g * (1.0 - sg))
            tl.store(dg_ptr + goff, dg.to(dg_ptr.dtype.element_ty), mask=inmap)
            do = do * g * sg
        if ZERO:
            dz -= do * o / z
            do = do / z
        dor, doi = _dft2(do, C1, S1, C2, S2, PREC)
        dpr += dor * vr + doi * vi  # conj(DO) V
        dpi += dor * vi - doi * vr
        dv = _idft2(pr * dor - pi * doi, pr * doi + pi * dor, C1, S1, C2, S2, PREC) * g_inv
        tl.store(dv_ptr + goff, dv.to(dv_ptr.dtype.element_ty), mask=inmap)
    dp = _idft2(dpr, dpi, C1, S1, C2, S2, PREC) * g_inv
    if ZERO:  # dZ's share: the box sums transposed
        dp += tl.dot(tl.dot(_box(P1, H, T1, True), dz, input_precision=PREC),
                     _box(P2, W, T2, False), input_precision=PREC)  # fmt: skip
    da = p * (dp - _sum2(p * dp)) * (scale * g_inv)  # the softmax backwards, s and 1/G
    dar, dai = _dft2(da, C1, S1, C2, S2, PREC)
    for c in range(D):  # Eq. 15 backwards: dq, dk
        off = base + c * sc + tok * sn
        goff = obase + c + tok * (HEADS * D)
        q = tl.load(q_ptr + off, mask=inmap, other=0.0).to(tl.float32)
        k = tl.load(k_ptr + off, mask=inmap, other=0.0).to(tl.float32)
        qr, qi = _dft2(q, C1, S1, C2, S2, PREC)
        kr, ki = _dft2(k, C1, S1, C2, S2, PREC)
        dq = _idft2(dar * kr + dai * ki, dar * ki - dai * kr, C1, S1, C2, S2, PREC)
        dk = _idft2(dar * qr - dai * qi, dar * qi + dai * qr, C1, S1, C2, S2, PREC)
        tl.store(dq_ptr + goff, dq.to(dq_ptr.dtype.element_ty), mask=inmap)
        tl.store(dk_ptr + goff, dk.to(dk_ptr.dtype.element_ty), mask=inmap)


def interpreted():
    """Whether the kernels run in Triton's interpreter (``TRITON_INTERPRET`` is read when
    they are defined, on this module's import)."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_fwd_kernel, InterpretedFunction)


def _launch_args(q, hw, heads, zero):
    h, w = hw
    grid = (2 * h - 1, 2 * w - 1) if zero else (h, w)
    t1, t2 = tile(grid[0]), tile(grid[1])
    warps = 8 if t1 * t2 >= 64 * 64 else 4
    return (q.shape[0] * heads,), grid, (t1, t2), warps


def forward(q, k, v, gate, hw, heads, zero, scale, precision):
    """y (B, N, C) in q's dtype from tokens q, k, v (sharing their strides) and the gate's
    pre-activation (any strides; or None) of an ``hw`` map; heads of C / heads channels."""
    b, n, c = q.shape
    out = q.new_empty((b, n, c))
    grid, (p1, p2), (t1, t2), warps = _launch_args(q, hw, heads, zero)
    g = q if gate is None else gate
    _fwd_kernel[grid](
        q, k, v, g, out, *q.stride(), *g.stride(), *hw, p1, p2, heads, c // heads, float(scale),
        T1=t1, T2=t2, ZERO=zero, GATE=gate is not None, PREC=precision, num_warps=warps,
    )  # fmt: skip
    return out


def backward(dy, q, k, v, gate, hw, heads, zero, scale, precision):
    """(dq, dk, dv, dgate) (B, N, C), contiguous, in q's dtype (dgate None without a gate)
    from dy (B, N, C) contiguous; see :func:`forward`."""
    grid, (p1, p2), (t1, t2), warps = _launch_args(q, hw, heads, zero)
    shape = q.shape
    dq, dk, dv = (q.new_empty(shape) for _ in range(3))
    dg = None if gate is None else q.new_empty(shape)
    c = shape[2]
    _bwd_kernel[grid](
        q, k, v, q if gate is None else gate, dy, dq, dk, dv, dq if dg is None else dg,
        *q.stride(), *(q if gate is None else gate).stride(), *hw, p1, p2, heads, c // heads,
        float(scale),
        T1=t1, T2=t2, ZERO=zero, GATE=gate is not None, PREC=precision, num_warps=warps,
    )  # fmt: skip
    return dq, dk, dv, dg
