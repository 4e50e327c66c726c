"""The trainer's torch-free name copies (pipesgd/train/choices.py) match their registries, and ``--help`` and a
usage error answer without loading torch."""
import subprocess
import sys

import pytest

from pipesgd import compression
from pipesgd.baselines import ddp, parameter_server
from pipesgd.grads import buffers
from pipesgd.train import choices, data, models, optimizers, precision


@pytest.mark.parametrize("copy, owner", [
    (choices.CODECS, lambda: compression.available()),
    (choices.MODELS, lambda: models.MODELS),
    (choices.TOKEN_MODELS, lambda: models.TOKEN_MODELS),
    (choices.DATASETS, lambda: data.DATASETS),
    (choices.DATASETS_WITH_DIR, lambda: data.DATASETS_WITH_DIR),
    (choices.TOKEN_DATASETS, lambda: data.TOKEN_DATASETS),
    (choices.OPTIMIZERS, lambda: optimizers.OPTIMIZERS),
    (choices.AMP_MODES, lambda: precision.AMP_DTYPES),
    (choices.SCALED_AMP_MODES, lambda: precision.SCALED_AMP_MODES),
    (choices.BUFFER_MODES, lambda: buffers.BUFFER_MODES),
    (choices.DDP_HOOKS, lambda: ddp.DDP_HOOKS),
    (choices.PS_MODES, lambda: parameter_server.MODES),
], ids=["codecs", "models", "token_models", "datasets", "datasets_with_dir", "token_datasets", "optimizers",
        "amp", "scaled_amp", "buffers", "ddp_hooks", "ps_modes"])
def test_each_copy_equals_its_registry(copy, owner):
    assert tuple(copy) == tuple(owner())


def test_a_name_registered_at_run_time_is_accepted():
    from pipesgd.train.config import TrainConfig

    models.MODELS["probe-net"] = models.MODELS["mlp"]
    try:
        assert TrainConfig(model="probe-net").model == "probe-net"
    finally:
        del models.MODELS["probe-net"]


_PROBE = ("import sys\nsys.argv = ['pipesgd-train', *sys.argv[1:]]\n"
          "try:\n    import pipesgd.train.__main__\nexcept SystemExit as e:\n"
          "    print('exit', e.code, 'torch' in sys.modules, file=sys.stderr)\n")


# (An unknown --model, --dataset, --compression or --optimizer asks its registry, which loads torch, since a
# name registered at run time counts.)
@pytest.mark.parametrize("argv, code", [(["--help"], 0), (["--no-such-flag"], 2), (["--device", "tpu"], 2)])
def test_help_and_usage_errors_load_no_torch(argv, code):
    proc = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, timeout=120)
    assert proc.stderr.strip().splitlines()[-1] == f"exit {code} False", proc.stderr
    if code == 0:
        assert "what to train:" in proc.stdout
    else:
        assert proc.stderr.startswith("pipesgd-train: error: "), proc.stderr
