"""Train an mmdet, mmseg or mmpretrain config (the library comes from default_scope).

python tools/train.py configs/ca_pvt_s_retinanet_coco.py [--amp] [--resume [CKPT]]
torchrun --nproc-per-node P tools/train.py CONFIG --launcher pytorch --shard
"""

from mmcirc.cli.train import main

if __name__ == '__main__':
    main()
