"""tools/analysis/get_flops.py's table: a part whose count rounds to zero reads 0.000 M and
0.0 %, never a negative zero (the backbone's remainder after its stages is a difference
of float sums)."""

from mmcirc.cli import get_flops as tool


def test_a_count_that_rounds_to_zero_has_no_sign(capsys):
    assert tool.fmt_flops(-1.2e-9) == tool.fmt_flops(-300.0) == tool.fmt_flops(0) == '0.000 M'
    assert tool.fmt_flops(-5e6) == '-5.000 M'  # a real deficit keeps its sign
    assert tool.fmt_flops(2.5e9) == '2.500 G'
    rows = [dict(part='backbone other', attention='-', flops=-1.2e-9, attn_flops=0.0, params=0)]
    summary = dict(flops=1e9, attn_flops=0.0, params=10, by_operator={}, unsupported_ops={})
    tool.print_table(rows, summary, 'title')
    (line,) = [ln for ln in capsys.readouterr().out.splitlines() if 'backbone other' in ln]
    assert line == '| backbone other | - | 0.000 M | 0.000 M | 0.0 % | 0.00 M |'
