"""The 2-D real transforms of circulant attention (METHOD.md section 1), two backends.

The operator body (:mod:`mmcirc.ops.circulant`) is written once against a transform
object ``T`` (:func:`transforms`, one per input shape: the layer's plan):

* ``T.grid``: the (Ph, Pw) grid of every transform (``T.circular``: the map itself);
  ``T.padded``: the grid is larger than the (2H-1) x (2W-1) offsets of
  ``boundary='zero'`` (its padding cells are masked); ``T.block_grid``: the grid the
  blocks of heads are sized on (``head_blocks``);
* ``T.rfft2(x, norm)``: the half spectrum (..., Ph, U) of real x (..., H, W) zero padded
  to the grid, U = Pw//2 + 1, ``norm`` as torch.fft's;
* ``T.irfft2(y, hw, norm)``: its real inverse cropped to ``hw`` (the rows are cropped
  between the two 1-D passes; large maps in the CPU layout one map at a time,
  :data:`MAP_BY_MAP_BYTES`);
* the spectral algebra of Eqs. 15-16 (:class:`_Transforms`): ``T.linear``, ``T.corr``,
  ``T.apply``, ``T.mask``, ``T.softmax``, ``T.row_mass``.

Backends (the ``fft_impl`` of :mod:`mmcirc.ops.settings`, e.g. by its ``export_mode``):

* ``'torch'`` (default): torch.fft on contiguous last axes; spectra are complex
  (..., Ph, U); the 'zero' grid is rounded up to a fast length (:func:`fft_grid`).
* ``'dft'`` (export): two real matrix products per transform with cos/sin matrices built
  in the forward from the runtime sizes (traced as ops, so a dynamic-shape graph follows
  the input size); spectra are real (..., Ph, U, 2), the (real, imag) layout of
  ``torch.view_as_real``; the 'zero' grid is exactly (2H-1) x (2W-1). Cost
  O(N (H + W)) per channel instead of O(N log N): for export only.

This file depends on torch only.
"""

import math

import torch

from .settings import check_choice, current, graph_capture

__all__ = ['BOUNDARIES', 'fft_grid', 'mask_padding', 'next_fast_len', 'row_mass', 'transforms']

BOUNDARIES = ('circular', 'zero')


def next_fast_len(n):
    """Smallest 5-smooth integer (only prime factors 2, 3, 5) >= ``n``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f'n must be a positive int, got {n!r}')
    m = n
    while True:
        r = m
        for f in (2, 3, 5):
            while r % f == 0:
                r //= f
        if r == 1:
            return m
        m += 1


def fft_grid(h, w, boundary='circular'):
    """FFT grid (Ph, Pw) used for an ``h x w`` map with the given boundary.

    ``'circular'``: the map itself. ``'zero'``: at least (2h-1) x (2w-1), the smallest
    grid on which neither correlation (Eq. 15 over the offsets, Eq. 16 on the in-map
    outputs) aliases, rounded up to a fast FFT length: the grid of :class:`TorchFFT`.
    """
    check_choice('boundary', boundary, BOUNDARIES)
    return TorchFFT((h, w), boundary).grid


def transforms(hw, boundary, dtype, device, cpu=False):
    """The transform object of the active backend (``fft_impl``) for an (H, W) map (see the module
    docstring); ``boundary`` one of BOUNDARIES (checked where the layer is built),
    ``dtype`` the real compute dtype, ``cpu`` the CPU layout (:mod:`mmcirc.ops.settings`),
    where the map-by-map inverse may run (:data:`MAP_BY_MAP_BYTES`; not in a captured
    graph)."""
    if current().fft_impl == 'dft':
        return MatmulDFT(hw, boundary, dtype, device)
    return TorchFFT(hw, boundary, dtype, cpu and not graph_capture())


def mask_padding(a, hw):
    """In place: -inf on the cells of the score maps a (..., Ph, Pw) that are no offset
    in [-(H-1), H-1] x [-(W-1), W-1] (index m >= 0 at m, m < 0 at P + m): rows
    H..Ph-H and columns W..Pw-W, a thin band of a grid rounded up to a fast length
    (symmetric under m -> -m, so the same band for the flipped scores a[-m])."""
    (h, w), (ph, pw) = hw, a.shape[-2:]
    a[..., h : ph - h + 1, :] = float('-inf')
    a[..., w : pw - w + 1] = float('-inf')
    return a


def row_mass(p, hw):
    """Z[i] = sum_m p[-m] [i + m inside the map], (..., H, W), from the flipped
    p[-m] (..., Ph, Pw) on the wrapped grid (the layout of :mod:`mmcirc.ops.circulant`), as box
    sums of two cumulative sums along contiguous last axes (torch's CPU cumsum along a
    non-last axis is far slower).

    Column c admits the column offsets -c..W-1-c, i.e. the flipped offsets c-(W-1)..c:
    columns 0..c and Pw-(W-1-c)..Pw-1 of the grid, so with C the inclusive cumulative
    sum over columns the column sum is C[c] + C[Pw-1] - C[Pw-W+c]; likewise the rows.
    """
    h, w = hw
    ph, pw = p.shape[-2:]
    c = p.cumsum(-1)  # (..., Ph, Pw)
    s = c[..., :w] + c[..., pw - 1 :] - c[..., pw - w :]  # (..., Ph, W)
    c = s.transpose(-1, -2).contiguous().cumsum(-1)  # (..., W, Ph)
    z = c[..., :h] + c[..., ph - 1 :] - c[..., ph - h :]  # (..., W, H)
    return z.transpose(-1, -2).contiguous()  # (..., H, W)


class _Transforms:
    """The backend-independent spectral algebra on ``mul``, ``conj`` and the real view
    (``as_real``, ``from_real``): torch's own functions for complex spectra, so that a
    step of the algebra calls no other Python function of the backend."""

    #: sizes may be symbolic (torch.export): no Python decision on them
    symbolic = False

    @classmethod
    def operand(cls, y, dtype=None):
        """The spectrum y (B, C, ...) as the operand of :meth:`linear`: its real view
        (B, C, ..., 2), cast to ``dtype`` when given (bfloat16 under autocast). Made once
        for all blocks of heads (each block's product reads all C channels: a cast per
        block re-cast the whole spectrum)."""
        r = cls.as_real(y)  # (B, C, Ph, U, 2)
        return r if dtype is None else r.to(dtype)

    @classmethod
    def linear(cls, weight, r, dtype):
        """Real ``weight`` (C_out, C) on the channels of a spectrum's :meth:`operand` r
        (B, C, ...): the spectrum (B, C_out, ...) with real dtype ``dtype``; the product in
        r's dtype."""
        b, c = r.shape[:2]
        w = weight.to(r.dtype).expand(b, -1, -1)  # (B, C_out, C)
        out = torch.bmm(w, r.reshape(b, c, -1))  # (B, C_out, Ph*U*2)
        return cls.from_real(out.to(dtype).view(b, -1, *r.shape[2:]))  # (B, C_out, Ph, U)

    def mask(self, a, hw):
        """-inf on the score cells (B, heads, Ph, Pw) that are no offset of an ``hw``
        map (:func:`mask_padding`); called where the grid is larger (``padded``)."""
        return mask_padding(a, hw)

    @staticmethod
    def softmax(a):
        """Softmax of each score map (B, heads, Ph, Pw) over all its offsets."""
        return torch.softmax(a.flatten(2), dim=-1).view_as(a)

    @staticmethod
    def row_mass(p, pf, hw):
        """Z[i] (B, heads, H, W) of ``boundary='zero'`` from p' (:func:`row_mass`; its
        spectrum ``pf`` unused here)."""
        return row_mass(p, hw)

    def corr(self, q, k, d):
        """Eq. 15 at the negated offsets: sum over each head's d channels of
        Q_c conj(K_c) = FFT(a') with a'[m] = a[-m], (B, C/d, ...)."""
        a = self.mul(q, self.conj(k))  # (B, C, ...); a lazy conj: the product makes it
        return a if d == 1 else a.view(a.shape[0], a.shape[1] // d, d, *a.shape[2:]).sum(2)

    def apply(self, p, v, d):
        """Eq. 16: conj(P) V = P' V per channel, from P' = FFT(p[-m]) (B, heads, ...),
        V (B, heads*d, ...)."""
        if d == 1:
            return self.mul(p, v)  # (B, C, ...)
        f = v.shape[2:]
        o = self.mul(
            p.unsqueeze(2), v.view(v.shape[0], v.shape[1] // d, d, *f)
        )  # (B, heads, d, ...)
        return o.view(v.shape)  # (B, C, ...)


#: from this size of one map's half spectrum (Ph x U complex values) on, a CPU inverse runs
#: map by map (:meth:`TorchFFT.irfft2`): torch's batched call copies the spectrum twice
#: between the (..., Ph, U) and (..., U, Ph) layouts, and for such maps these copies cost
#: as much as the transforms. Smaller maps keep the batched call, whose per-call overhead
#: is then the larger cost (measured in docs/benchmarks.md).
MAP_BY_MAP_BYTES = 1 << 22


class TorchFFT(_Transforms):
    """torch.fft backend: complex spectra (..., Ph, U), every 1-D pass over a
    contiguous last axis or the row axis of contiguous rows. ``maps``: the inverse of a
    plain tensor runs map by map when one map's spectrum of ``dtype`` (real) is at least
    :data:`MAP_BY_MAP_BYTES` (the CPU layout of :mod:`mmcirc.ops.settings`, eager)."""

    mul = staticmethod(torch.mul)
    conj = staticmethod(torch.conj)
    as_real = staticmethod(torch.view_as_real)
    from_real = staticmethod(torch.view_as_complex)

    def __init__(self, hw, boundary, dtype=torch.float32, maps=False):
        (h, w), self.circular = hw, boundary == 'circular'  # circular: the grid is the map
        self.grid = (
            (h, w) if self.circular else (next_fast_len(2 * h - 1), next_fast_len(2 * w - 1))
        )
        self.block_grid = self.grid  # the grid the blocks of heads are sized on
        self.padded = boundary == 'zero' and self.grid != (2 * hw[0] - 1, 2 * hw[1] - 1)
        size = self.grid[0] * (self.grid[1] // 2 + 1) * 2 * dtype.itemsize  # one spectrum
        self.maps = maps and size >= MAP_BY_MAP_BYTES

    def rfft2(self, x, norm='backward'):
        return torch.fft.rfft2(x, s=self.grid, norm=norm)  # (..., Ph, U)

    def irfft2(self, y, hw, norm='backward'):
        if self.maps and type(y) is torch.Tensor and y.numel():
            return self.irfft2_maps(y, hw, norm)
        if tuple(hw) == self.grid:  # one 2-D call
            return torch.fft.irfft2(y, s=self.grid, norm=norm)  # (..., Ph, Pw)
        # cropped: the H pass first (complex, all U columns), cropped to H rows, then
        # the W pass on those rows only (a 2-D norm is the product of the 1-D ones)
        y = torch.fft.ifft(y, dim=-2, norm=norm)[..., : hw[0], :]  # (..., H, U)
        return torch.fft.irfft(y, n=self.grid[1], dim=-1, norm=norm)[..., : hw[1]]  # (..., H, W)

    def irfft2_maps(self, y, hw, norm='backward'):
        """:meth:`irfft2` one map at a time, with no layout copy: the H pass of a map
        (Ph, U) batches its U columns at stride 1 and stores its result transposed,
        (U, Ph), so the W pass then batches the H rows at stride 1 (torch's CPU FFT takes
        one batch stride; the batched call over (..., Ph, U) copies the spectrum to
        (..., U, Ph) before the H pass and back before the W pass)."""
        (h, w), (ph, pw) = hw, self.grid
        maps = y.reshape(-1, ph, y.shape[-1])  # (M, Ph, U)
        parts = (  # H pass (H, U), stored (U, Ph); W pass (H, Pw), cropped to (H, W)
            torch.fft.irfft(torch.fft.ifft(m, dim=0, norm=norm)[:h], n=pw, dim=1, norm=norm)[:, :w]
            for m in maps
        )
        if torch.is_grad_enabled() and y.requires_grad:  # one stack: M copies into one
            # output would have M full-size backwards
            return torch.stack(list(parts)).view(*y.shape[:-2], h, w)  # (..., H, W)
        out = y.new_empty((maps.shape[0], h, w), dtype=y.real.dtype)  # (M, H, W)
        for o, part in zip(out, parts):  # one map's result at a time (no list of M maps)
            o.copy_(part)
        return out.view(*y.shape[:-2], h, w)  # (..., H, W)


class MatmulDFT(_Transforms):
    """Matmul-DFT backend (export): real spectra (..., Ph, U, 2), exact 'zero' grid.

    The DFT matrices: cos/sin of 2 pi j k / Ph (Ph, Ph), of 2 pi j u / Pw (Pw, U), and
    the inverse's (U, Pw) with the Hermitian weights (1 for u = 0 and u = Pw/2, else 2)
    and 1/(Ph Pw). j*k is reduced mod P in integers, so every angle lies in [0, 2 pi). P
    enters as a tensor (the last index + 1), never as a Python scalar, so that a traced
    graph keeps it symbolic (ONNX: Range, Mod, Cos, Sin on the input size).
    """

    symbolic = True
    padded = False

    def __init__(self, hw, boundary, dtype, device):
        h, w = hw
        self.circular = boundary == 'circular'  # the grid is the map
        self.grid = (h, w) if self.circular else (2 * h - 1, 2 * w - 1)
        j = torch.arange(self.grid[0], device=device)  # (Ph,)
        p = j[-1:] + 1  # Ph as a (1,) tensor
        ang = (j[:, None] * j[None, :] % p).to(dtype) * (2 * math.pi) / p
        self.ch, self.sh = ang.cos(), ang.sin()  # (Ph, Ph), symmetric
        norm = p.to(dtype)  # Ph
        j = torch.arange(self.grid[1], device=device)  # (Pw,)
        p = j[-1:] + 1  # Pw as a (1,) tensor
        u = j[: self.grid[1] // 2 + 1]  # (U,)
        ang = (j[:, None] * u[None, :] % p).to(dtype) * (2 * math.pi) / p
        self.cw, self.sw = ang.cos(), ang.sin()  # (Pw, U)
        wts = (2 - (u == 0).to(dtype) - (2 * u == p).to(dtype)) / (norm * p)  # (U,)
        self.icw = (self.cw * wts).transpose(0, 1)  # (U, Pw)
        self.isw = (self.sw * wts).transpose(0, 1)  # (U, Pw)
        self.root = (norm * p).sqrt()  # sqrt(Ph Pw), (1,): the 'ortho' factor

    def rfft2(self, x, norm='backward'):
        h, w = x.shape[-2:]
        xr, xi = x @ self.cw[:w], -(x @ self.sw[:w])  # along W: e^{-i theta} (..., H, U)
        ch, sh = self.ch[:, :h], self.sh[:, :h]  # (Ph, H)
        y = torch.stack([ch @ xr + sh @ xi, ch @ xi - sh @ xr], -1)  # (..., Ph, U, 2)
        return y / self.root if norm == 'ortho' else y

    def irfft2(self, y, hw, norm='backward'):
        h, w = hw
        yr, yi = y.unbind(-1)  # (..., Ph, U) each
        ch, sh = self.ch[:h], self.sh[:h]  # (H, Ph)
        zr, zi = ch @ yr - sh @ yi, ch @ yi + sh @ yr  # along H: (..., H, U)
        x = zr @ self.icw[:, :w] - zi @ self.isw[:, :w]  # real part along W (..., H, W)
        return x if norm == 'backward' else x * (self.root if norm == 'ortho' else self.root**2)

    @staticmethod
    def mul(a, b):
        (ar, ai), (br, bi) = a.unbind(-1), b.unbind(-1)
        return torch.stack([ar * br - ai * bi, ar * bi + ai * br], -1)  # (..., 2)

    @staticmethod
    def conj(a):
        return torch.stack([a[..., 0], -a[..., 1]], -1)  # (..., 2)

    @staticmethod
    def as_real(y):
        return y

    @staticmethod
    def from_real(r):
        return r
