"""The trainer's modes by ``--mode`` name (how gradients meet) and what a mode decides before any wrapper
exists: which modes run our ring, which dedicate ranks to serving. ``strategy`` builds a wrapper per name; the
config validates names against ``MODES``."""
from __future__ import annotations

# The parameter server's own modes, copied where no torch loads (choices.py says why).
from .choices import PS_MODES

# Modes whose gradients travel our ring: only they take --compression, --error-feedback, --check-replicas.
RING_MODES = ("pipe", "sync")
DDP_MODE = "ddp"
PS_TRAIN_MODES = tuple(f"ps-{mode}" for mode in PS_MODES)
# Periodic averaging: each rank steps on its own gradients and the ranks meet every --sync-every steps.
LOCAL_SGD_MODE = "localsgd"
DILOCO_MODE = "diloco"
PERIODIC_MODES = (LOCAL_SGD_MODE, DILOCO_MODE)
MODES = (*RING_MODES, DDP_MODE, *PS_TRAIN_MODES, *PERIODIC_MODES)


def num_workers_for(mode: str, servers: int, world_size: int) -> int:
    """How many ranks train (and share the data) before any wrapper exists, for validation."""
    return world_size - servers if mode in PS_TRAIN_MODES else world_size
