"""``timing_model.atomic``: whole files or none, with the permissions ``open(path, "w")`` would give."""
from __future__ import annotations

import os
import stat

import pytest

from timing_model.atomic import atomic_open, write_text_atomic


@pytest.fixture
def umask():
    """Set the process umask for one test, restored after it."""
    previous = os.umask(0o022)
    yield os.umask
    os.umask(previous)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask,expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_umask(umask, tmp_path, mask, expected):
    umask(mask)
    path = tmp_path / "result.json"
    write_text_atomic(str(path), "{}\n")
    assert _mode(path) == expected and path.read_text() == "{}\n"


def test_a_replaced_file_keeps_its_mode(umask, tmp_path):
    umask(0o022)
    path = tmp_path / "result.json"
    path.write_text("old\n")
    os.chmod(path, 0o640)
    write_text_atomic(str(path), "new\n")
    assert _mode(path) == 0o640 and path.read_text() == "new\n"


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path):
    path = tmp_path / "result.json"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="interrupted"):
        with atomic_open(str(path)) as handle:
            handle.write("half")
            raise RuntimeError("interrupted")
    assert os.listdir(tmp_path) == ["result.json"] and path.read_text() == "old\n"


def test_the_calibration_json_is_written_by_it(umask, tmp_path):
    """``pipesgd-timing calibrate``'s file goes through the same helper (it had a temp-file writer of its own)."""
    from timing_model.calibration import Calibration, Fit, read_calibration, write_calibration

    umask(0o022)
    path = tmp_path / "calib.json"
    write_calibration(str(path), Calibration({"ring": Fit(0.0, 1e-5, 1e9, float("inf"), 2, 0.0, 0.0)}))
    assert _mode(path) == 0o644 and read_calibration(str(path)).fits["ring"].bandwidth_Bps == 1e9
    assert os.listdir(tmp_path) == ["calib.json"]
