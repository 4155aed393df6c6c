# CA-PVT-T + Semantic FPN with circulant attention in all four stages (no quadratic
# 'sra' stage left): for whole-image inference at 2048-4096 px (tools/infer_highres.py).
_base_ = './ca_pvt_t_fpn_80k_ade20k.py'
model = dict(backbone=dict(stage_attentions='circulant'))
