"""The names the trainer's flags offer, as plain tuples, so that ``--help`` and the flag checks load no torch.

Each tuple copies the names of the registry that owns them (named beside it, all of which import torch);
tests/test_train_choices.py fails when one side gains a name the other lacks. A name registered at run time
(``pipesgd.compression.register``, ``pipesgd.train.models.register``) is still accepted: the config asks the
live registry for any name it does not find here.
"""
from __future__ import annotations

CODECS = ("bf16", "fp16", "none", "q4", "q8", "sign")  # pipesgd.compression.available()
MODELS = ("mlp", "lenet", "bncnn", "resnet20", "alexnet", "gpt")  # pipesgd.train.models.MODELS
TOKEN_MODELS = ("gpt",)  # pipesgd.train.models.TOKEN_MODELS
DATASETS = ("digits", "synthetic", "mnist1d", "mnist", "cifar10", "pysrc")  # pipesgd.train.data.DATASETS
DATASETS_WITH_DIR = ("mnist", "cifar10")  # pipesgd.train.data.DATASETS_WITH_DIR
TOKEN_DATASETS = ("pysrc",)  # pipesgd.train.data.TOKEN_DATASETS
OPTIMIZERS = ("sgd", "adam", "adamw", "muon")  # pipesgd.train.optimizers.OPTIMIZERS
AMP_MODES = ("none", "bf16", "fp16")  # pipesgd.train.precision.AMP_DTYPES
SCALED_AMP_MODES = ("fp16",)  # pipesgd.train.precision.SCALED_AMP_MODES
BUFFER_MODES = ("broadcast", "average", "none")  # pipesgd.grads.buffers.BUFFER_MODES
DDP_HOOKS = ("none", "fp16", "powersgd")  # pipesgd.baselines.ddp.DDP_HOOKS
PS_MODES = ("sync", "async")  # pipesgd.baselines.parameter_server.MODES
