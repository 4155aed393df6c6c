"""Dense O(N^2) references for the attention operators.

They materialise every score and the full N x N attention matrix with explicit
index arithmetic and never call the code under test (no FFT, no chunking, no
folded projections).
"""

import math

import torch


def offset_index(h, w, boundary):
    """For every token pair (i, j) the index of the offset m = j - i.

    Returns (idx (N, N) long, number of offsets). circular: m = (j - i) mod
    (H, W), H*W offsets; zero: m in [-(H-1), H-1] x [-(W-1), W-1], offset
    (mr, mc) stored at (mr + H - 1) * (2W - 1) + (mc + W - 1).
    """
    r = torch.arange(h).repeat_interleave(w)  # row of token i (row-major)
    c = torch.arange(w).repeat(h)  # column of token i
    dr = r[None, :] - r[:, None]  # (N, N): row of j minus row of i
    dc = c[None, :] - c[:, None]
    if boundary == 'circular':
        return (dr % h) * w + (dc % w), h * w
    if boundary == 'zero':
        n_off = (2 * h - 1) * (2 * w - 1)
        return (dr + h - 1) * (2 * w - 1) + (dc + w - 1), n_off
    raise ValueError(boundary)


def circulant_attention_dense(q, k, v, boundary='circular', num_heads=None, scale='sqrt_n'):
    """Dense circulant attention on (B, H, W, C); returns (B, H, W, C).

    a[m] = s * sum over pairs (i, j) with j - i = m (in-map pairs only for
    'zero') of q_i . k_j (over the head's channels); p = softmax over offsets;
    A[i, j] = p[j - i] (rows renormalised for 'zero'); o = A v.
    """
    b, h, w, c = q.shape
    n = h * w
    heads = c if num_heads is None else num_heads
    d = c // heads
    if scale == 'sqrt_n':
        s = 1.0 / math.sqrt(n * d)
    elif scale == 'n':
        s = 1.0 / (n * math.sqrt(d))
    else:
        s = float(scale)
    idx, n_off = offset_index(h, w, boundary)
    qh = q.reshape(b, n, heads, d)
    kh = k.reshape(b, n, heads, d)
    vh = v.reshape(b, n, heads, d)
    out = torch.empty_like(vh)
    for bi in range(b):
        for hi in range(heads):
            pair = qh[bi, :, hi] @ kh[bi, :, hi].T  # (N, N): q_i . k_j
            a = (
                torch.zeros(n_off, dtype=q.dtype).index_add(0, idx.flatten(), pair.flatten()) * s
            )  # a[m]
            if boundary == 'zero':
                hit = torch.zeros(n_off, dtype=torch.bool)
                hit[idx.flatten()] = True  # every offset occurs in some pair
                assert bool(hit.all())
            p = torch.softmax(a, dim=0)
            attn = p[idx]  # (N, N): A[i, j] = p[j - i]
            if boundary == 'zero':
                attn = attn / attn.sum(dim=1, keepdim=True)
            out[bi, :, hi] = attn @ vh[bi, :, hi]
    return out.reshape(b, h, w, c)


def circulant_module_dense(module, x, hw_shape):
    """Dense reference of CirculantAttention.forward with its parameters:
    project q, k, v in token space, dense attention, gate, projection."""
    b, n, c = x.shape
    h, w = hw_shape
    gate = torch.nn.functional.silu(x @ module.gate[0].weight.T + module.gate[0].bias)
    q, k, v = (x @ module.qkv.weight.T).chunk(3, dim=-1)
    o = circulant_attention_dense(
        *(t.reshape(b, h, w, c) for t in (q, k, v)),
        boundary=module.boundary,
        num_heads=module.num_heads,
        scale=module.scale,
    ).reshape(b, n, c)
    return (o * gate) @ module.proj.weight.T + module.proj.bias


def _linear(x, layer):
    y = x @ layer.weight.T
    return y if layer.bias is None else y + layer.bias


def mha_dense(query, key, value, wq, wk, wv, num_heads):
    """Plain multi-head attention, heads concatenated (no output projection).

    query (B, Lq, C), key/value (B, Lk, C); wq/wk/wv nn.Linear layers.
    softmax(q k^T / sqrt(head width)) v per head, written out explicitly.
    """
    b, lq, c = query.shape
    lk = key.shape[1]
    dh = c // num_heads
    q = _linear(query, wq).reshape(b, lq, num_heads, dh).transpose(1, 2)
    k = _linear(key, wk).reshape(b, lk, num_heads, dh).transpose(1, 2)
    v = _linear(value, wv).reshape(b, lk, num_heads, dh).transpose(1, 2)
    scores = q @ k.transpose(-1, -2) / math.sqrt(dh)  # (B, heads, Lq, Lk)
    attn = torch.exp(scores - scores.amax(-1, keepdim=True))
    attn = attn / attn.sum(-1, keepdim=True)
    return (attn @ v).transpose(1, 2).reshape(b, lq, c)


def core_attention_dense(module, x, cores):
    """Dense reference of CoreAttention.forward with its parameters.

    gather:    g  = MHA(cores W_qc, x W_kp, x W_vp);  c' = cores + core_proj(g)
    broadcast: x' = MHA(x W_qp, c' W_kc, c' W_vc);    y  = proj(x')
    """
    h = module.num_heads
    g = mha_dense(cores, x, x, module.q_core, module.k_patch, module.v_patch, h)
    new_cores = cores + _linear(g, module.core_proj)
    xb = mha_dense(x, new_cores, new_cores, module.q_patch, module.k_core, module.v_core, h)
    return _linear(xb, module.proj), new_cores
