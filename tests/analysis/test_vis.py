"""mmcirc.analysis.vis: what the attention-visualisation tools take from the package."""

import json

from mmcirc.analysis.vis import short_name, write_outputs


def test_short_name_is_a_file_name_part():
    assert short_name('backbone.layers.2.1.0.attn') == 'layers.2.1.0.attn'
    assert short_name('neck/odd name') == 'neck-odd-name'
    assert short_name('backbone.') == 'model'


def test_write_outputs_lists_the_files_and_writes_the_json_last(tmp_path):
    record = dict(value=1)
    write_outputs(
        {tmp_path / 'out' / 'b.png': b'PNG-B', tmp_path / 'out' / 'a.png': b'PNG-A'},
        record,
        tmp_path / 'out' / 'r.json',
    )
    assert (tmp_path / 'out' / 'a.png').read_bytes() == b'PNG-A'
    saved = json.loads((tmp_path / 'out' / 'r.json').read_text())
    assert saved == dict(value=1, outputs=['a.png', 'b.png', 'r.json'])
    assert sorted(p.name for p in (tmp_path / 'out').iterdir()) == ['a.png', 'b.png', 'r.json']
