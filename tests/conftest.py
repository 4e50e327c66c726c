"""Fixtures that more than one test module asserts on: a launched run costs more than the checks read from it."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ddp_style_run(tmp_path_factory):
    """tests/ddp_style_script.py launched once by torchrun on 2 ranks, uninterrupted, ending without flush():
    (its output folder, the finished process). test_ddp_migration resumes from the checkpoint it leaves there;
    test_lifecycle reads how its processes ended."""
    from tests.test_ddp_migration import DDP_STYLE_SCRIPT, torchrun

    out = tmp_path_factory.mktemp("ddp_style")
    return out, torchrun(DDP_STYLE_SCRIPT, str(out))
