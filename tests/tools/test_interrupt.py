"""Ctrl-C (SIGINT) during a command's work: one ``error: interrupted`` line on stderr, no
traceback, exit status 130 (as shells report an interrupted command), nothing half made
left."""

import os
import signal
import subprocess
import sys
import time

from helpers import REPO


def test_ctrl_c_during_make_toy_data_is_one_line_and_exit_130(tmp_path):
    out = tmp_path / 'data'
    env = dict(os.environ, PYTHONPATH=REPO, PYTHONUNBUFFERED='1')
    env.pop('MMCIRC_DEBUG', None)
    script = os.path.join(REPO, 'tools/dataset_converters/make_toy_data.py')
    proc = subprocess.Popen(
        [sys.executable, script, 'imagenet', '--num-train', '100000', '--out', str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not any(out.rglob('*.jpg')):  # the work has started
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, 'no image written in 120 s'
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines() == ['error: interrupted'], err[-2000:]
    assert list(out.iterdir()) == []  # the half-made dataset removed
