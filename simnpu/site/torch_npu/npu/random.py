"""``torch.npu.random`` of the simulated NPU."""
import torch  # noqa: F401  (the real torch_npu.npu.random binds it too)
from _simnpu._api import (  # noqa: F401
    _lazy_init,
    current_device,
    device_count,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)

__all__ = ["get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
           "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]
