"""mmcirc.cli.image_io: sizes, images (files, demo), palettes and overlays."""

import cv2
import numpy as np
import pytest

from mmcirc.cli import image_io as imio


def test_load_images_reads_every_file_resized(tmp_path):
    paths = []
    for name, hw in (('a', (20, 40)), ('b', (30, 10))):
        paths.append(str(tmp_path / f'{name}.png'))
        cv2.imwrite(paths[-1], np.zeros((*hw, 3), np.uint8))
    loaded = imio.load_images(paths, None, 80)
    assert [(n, i.shape, s, w) for n, i, s, w in loaded] == [
        ('a', (40, 80, 3), (20, 40), paths[0]),
        ('b', (80, 27, 3), (30, 10), paths[1]),
    ]
    with pytest.raises(ValueError, match='cannot read image'):
        imio.load_images([paths[0], str(tmp_path / 'missing.png')], None, None)


def test_parse_size():
    assert imio.parse_size(None) is None
    assert imio.parse_size('4096') == 4096
    assert imio.parse_size('97x131') == (97, 131)
    for bad in ('0', 'x', '12x', '-3', 'big', '3x0'):
        with pytest.raises(ValueError, match='--size'):
            imio.parse_size(bad)
    img = np.zeros((50, 100, 3), np.uint8)
    assert imio.resize_image(img, 300).shape == (150, 300, 3)
    assert imio.resize_image(img, (97, 131)).shape == (97, 131, 3)


def test_read_image_errors(tmp_path):
    bad = tmp_path / 'bad.png'
    bad.write_bytes(b'not a png')
    for path in (str(bad), str(tmp_path / 'missing.jpg'), str(tmp_path)):
        with pytest.raises(ValueError) as err:
            imio.read_image(path)
        assert str(err.value) == f'cannot read image: {path}'


def test_colorize_and_overlay():
    palette = [[10, 20, 30], [200, 100, 0]]
    color = imio.colorize(np.array([[0, 1]]), palette)
    np.testing.assert_array_equal(color, np.array([[[10, 20, 30], [200, 100, 0]]], np.uint8))
    img = np.full((1, 2, 3), 100, np.uint8)
    # BGR image, RGB mask: 0.25 * 100 + 0.75 * mask[..., ::-1], rounded
    np.testing.assert_array_equal(
        imio.overlay(img, color, 0.75), np.array([[[48, 40, 33], [25, 100, 175]]], np.uint8)
    )
