""".ci/install on a system Python that refuses pip (PEP 668): one line naming the venv to make, exit 2, and no pip;
elsewhere its check lets the install go on."""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INSTALL = os.path.join(ROOT, ".ci", "install")


def test_a_system_managed_python_gets_one_line_and_exit_2(tmp_path):
    calls = tmp_path / "calls"
    fake = tmp_path / "python3"  # answers "managed" to the check (its only -c with sysconfig), records the rest
    fake.write_text('#!/bin/sh\ncase "$2" in *EXTERNALLY-MANAGED*) exit 0;; esac\n'
                    f'echo "$@" >> {calls}\nexit 0\n')
    fake.chmod(0o755)
    proc = subprocess.run(["bash", INSTALL], env={**os.environ, "PYTHON": str(fake)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "PEP 668" in proc.stderr and "venv --system-site-packages" in proc.stderr
    assert not calls.exists()  # nothing imported, nothing installed


def test_the_check_lets_an_unmanaged_python_or_a_venv_go_on():
    check = re.search(r"MANAGED='(.*?)'\n", open(INSTALL).read(), re.S).group(1)
    assert "EXTERNALLY-MANAGED" in check
    assert subprocess.run([sys.executable, "-c", check], timeout=60).returncode == 1  # this test's Python: not managed
