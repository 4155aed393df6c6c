"""Small variants of the registered timm models (their sizes through timm's kwargs)."""

#: registered name -> kwargs making it small (arch, patch size, classes).
SMALL = {
    'ca_deit_tiny': dict(arch=dict(embed_dims=16, depth=2), patch_size=8),
    'veca_small': dict(
        arch=dict(embed_dims=16, num_layers=2, num_heads=2, mlp_ratio=2.0, num_cores=16),
        patch_size=8,
    ),
    'ca_pvt_tiny': dict(
        arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2))
    ),
    'core_pvt_tiny': dict(
        arch=dict(embed_dims=(8, 16, 24, 32), depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2)),
        num_cores_max=8,
    ),
    'ca_swin_tiny': dict(
        arch=dict(embed_dims=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2)), window_size=2
    ),
    'core_swin_tiny': dict(
        arch=dict(embed_dims=8, depths=(1, 1, 1, 1), num_heads=(1, 1, 1, 2)),
        window_size=2,
        num_cores_max=8,
    ),
}
