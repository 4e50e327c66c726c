"""Muon for a model's hidden weight matrices and AdamW for everything else, as one ``torch.optim.Optimizer``.

``torch.optim.Muon`` takes 2-D parameters only and leaves embeddings, the head, biases and norms to a method such
as AdamW, while a wrapper such as ``PipeSGD`` wraps one optimizer. So ``MuonAdamW`` holds both and shows them as
one: each param group says which steps it (``use_muon``, as Keller Jordan's ``MuonWithAuxAdam``), ``param_groups``
are the two optimizers' own group dicts and ``state`` one dict both use, so ``state_dict`` and ``zero_grad`` are
torch's own. One learning rate and weight decay serve both: Muon's update is scaled with torch's
``adjust_lr_fn="match_rms_adamw"`` to AdamW's typical size ("Muon is Scalable for LLM Training")."""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

MUON_MOMENTUM = 0.95  # torch's Muon default (Keller Jordan's), with Nesterov momentum
ADJUST_LR_FN = "match_rms_adamw"
MUON_KEY = "use_muon"  # the param group key that says which optimizer steps the group


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The weight matrices of ``model``'s hidden layers, the ones Muon is for: every ``nn.Linear``'s weight except
    the last ``nn.Linear``'s in module order (the output head), leaving out any that an ``nn.Embedding`` also holds
    (a tied head) and any that is frozen. Convolutions (not 2-D), embeddings, biases and norms are not among them."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    embedded = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    return [m.weight for m in linears[:-1] if m.weight.requires_grad and id(m.weight) not in embedded]


def _muon_class() -> type[torch.optim.Optimizer]:
    muon = getattr(torch.optim, "Muon", None)
    if muon is None:
        raise RuntimeError(f"MuonAdamW needs torch.optim.Muon, which this torch ({torch.__version__}) lacks")
    return muon


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` steps the groups with ``use_muon=True`` (2-D parameters only), ``torch.optim.AdamW`` the
    groups with ``use_muon=False`` (module doc). A group's own keys override the defaults given here, as in any torch
    optimizer; ``ns_coefficients``, ``ns_steps`` and both ``eps`` are torch's defaults unless a group sets them.
    ``self.muon`` and ``self.adamw`` are the two optimizers (None until a group needs one)."""

    def __init__(self, params: Iterable[dict], lr: float = 1e-3, weight_decay: float = 0.1,
                 momentum: float = MUON_MOMENTUM, nesterov: bool = True, adjust_lr_fn: str | None = ADJUST_LR_FN,
                 betas: tuple[float, float] = (0.9, 0.999)) -> None:
        self.muon: torch.optim.Optimizer | None = None
        self.adamw: torch.optim.AdamW | None = None
        self._muon_defaults = {"lr": lr, "weight_decay": weight_decay, "momentum": momentum, "nesterov": nesterov,
                               "adjust_lr_fn": adjust_lr_fn}
        self._adamw_defaults = {"lr": lr, "weight_decay": weight_decay, "betas": betas}
        super().__init__(params, {})  # no defaults of its own: each group takes its optimizer's (add_param_group)
        self.defaults = {**self._muon_defaults, "betas": betas}

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        """The optimizers that hold groups, Muon's first."""
        return [o for o in (self.muon, self.adamw) if o is not None]

    def add_param_group(self, param_group: dict) -> None:
        """Add ``param_group`` (with ``use_muon`` True or False) to this optimizer and to the one it names; the group
        dict is shared, so a change to its ``lr`` reaches both views."""
        kind = param_group.get(MUON_KEY) if isinstance(param_group, dict) else None
        if not isinstance(kind, bool):
            raise ValueError(f"each param group of MuonAdamW says which optimizer steps it: {MUON_KEY}=True "
                             f"(Muon, 2-D parameters) or False (AdamW)")
        # torch's checks (no parameter in two groups) and list of params, without this optimizer's defaults: each
        # group takes those of the optimizer that steps it, which fills them in below.
        defaults, self.defaults = self.defaults, {}
        try:
            super().add_param_group(param_group)
        finally:
            self.defaults = defaults
        try:
            if kind and any(p.ndim != 2 for p in param_group["params"]):
                shape = next(tuple(p.shape) for p in param_group["params"] if p.ndim != 2)
                raise ValueError(f"a {MUON_KEY}=True group holds a parameter of shape {shape}: Muon steps 2-D "
                                 f"parameters only; put it in a {MUON_KEY}=False (AdamW) group")
            child = self.muon if kind else self.adamw
            if child is not None:
                child.add_param_group(param_group)
            elif kind:
                self.muon = _muon_class()([param_group], **self._muon_defaults)
            else:
                self.adamw = torch.optim.AdamW([param_group], **self._adamw_defaults)
        except BaseException:
            self.param_groups.pop()
            raise
        self._link()

    def _link(self) -> None:
        """Point both optimizers at this one's group dicts and state (after a new group or a load)."""
        for child, kind in ((self.muon, True), (self.adamw, False)):
            if child is not None:
                child.param_groups = [g for g in self.param_groups if g[MUON_KEY] is kind]
                child.state = self.state

    @torch.no_grad()
    def step(self, closure=None):
        """One step of each optimizer on its groups (a ``closure`` is called once first, to compute gradients)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for child in self.optimizers:
            child.step()
        return loss

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's own loading (its checks, the state cast to each parameter's device and dtype), then both
        optimizers pointed at the new group dicts and state."""
        super().load_state_dict(state_dict)
        self._link()

    def __getstate__(self) -> dict:
        # Pickling and deepcopy keep both optimizers (torch's keeps the groups and state alone); the shared group
        # dicts and state stay shared in the copy.
        return {**super().__getstate__(), "muon": self.muon, "adamw": self.adamw,
                "_muon_defaults": self._muon_defaults, "_adamw_defaults": self._adamw_defaults}
