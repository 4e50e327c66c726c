"""``wrap(optimizer, model, **kwargs)``: a PipeSGD from one flat set of keyword arguments, the constructor's own and
``PipeSGDOptions``' fields alike, for tests that parametrize over both."""
from __future__ import annotations

from dataclasses import fields

from pipesgd import PipeSGD, PipeSGDOptions

OPTION_FIELDS = {f.name for f in fields(PipeSGDOptions)}


def split_options(kwargs: dict) -> tuple[dict, PipeSGDOptions]:
    """The constructor's keyword arguments, and the options built from the rest."""
    own = {k: v for k, v in kwargs.items() if k not in OPTION_FIELDS}
    return own, PipeSGDOptions(**{k: v for k, v in kwargs.items() if k in OPTION_FIELDS})


def wrap(optimizer, model, **kwargs) -> PipeSGD:
    own, options = split_options(kwargs)
    return PipeSGD(optimizer, model, options=options, **own)
