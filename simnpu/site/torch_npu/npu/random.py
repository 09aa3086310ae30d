"""``torch.npu.random`` of the simulated NPU."""
import torch  # noqa: F401  (the real torch_npu.npu.random binds it too)
from _simnpu._api import (  # noqa: F401
    _lazy_init,
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

from _simnpu import NEW as _new

if not _new:   # 2.9.0.post2's binds current_device here, 2.14.0's does not
    from _simnpu._api import current_device  # noqa: F401
del _new

__all__ = ["get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all",
           "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed"]
