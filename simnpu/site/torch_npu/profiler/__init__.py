"""``torch_npu.profiler`` of the simulated NPU: the real names and parameters (torch_npu 2.9.0.post2
``profiler/__init__.py``, ``profiler.py``, ``scheduler.py``), recorded by torch's own profiler of the host: every
kernel of the stand-in runs on the CPU, so there is no device time.

``tensorboard_trace_handler(dir_name)`` puts the trace where the real one puts its results:
``<dir_name or cwd>/<worker_name or hostname>_<pid>_<YYYYmmddHHMMSSfff>_ascend_pt/ASCEND_PROFILER_OUTPUT/trace_view.json``
(chrome trace format: open it in chrome://tracing or Perfetto). The real analysis writes more files there
(``kernel_details.csv``, ``operator_details.csv``, ``step_trace_time.csv``, ...) from the card's kernels, and
``profile`` has no ``key_averages()`` in either. ``_ExperimentalConfig`` and its levels are not simulated.
"""
import datetime
import enum
import os
import socket

import torch

__all__ = ["profile", "ProfilerActivity", "supported_activities", "tensorboard_trace_handler", "schedule",
           "ProfilerAction"]


class ProfilerActivity(enum.Enum):
    CPU = 0
    NPU = 1


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


def supported_activities():
    return {ProfilerActivity.CPU, ProfilerActivity.NPU}


class schedule:  # the real one is `Schedule`, exported as `schedule`: note its order (wait, active, warmup)
    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0) -> None:
        self.wait, self.active, self.warmup, self.repeat, self.skip_first = wait, active, warmup, repeat, skip_first
        self._torch = torch.profiler.schedule(wait=wait, warmup=warmup, active=active, repeat=repeat,
                                              skip_first=skip_first)

    def __call__(self, step: int) -> ProfilerAction:
        return ProfilerAction[self._torch(step).name]


def tensorboard_trace_handler(dir_name: str = None, worker_name: str = None, analyse_flag: bool = True,
                              async_mode: bool = False):
    def handler_fn(prof_inst) -> None:
        stamp = datetime.datetime.now().strftime("%Y%m%d%H%M%S%f")[:-3]
        span = f"{worker_name or socket.gethostname()}_{os.getpid()}_{stamp}_ascend_pt"
        out = os.path.join(os.path.realpath(dir_name) if dir_name else os.getcwd(), span, "ASCEND_PROFILER_OUTPUT")
        os.makedirs(out, exist_ok=True)
        prof_inst.export_chrome_trace(os.path.join(out, "trace_view.json"))

    return handler_fn


class profile:
    def __init__(self, *, activities=None, schedule=None, on_trace_ready=None, record_shapes: bool = False,
                 profile_memory: bool = False, with_stack: bool = False, with_flops: bool = False,
                 with_modules: bool = False, experimental_config=None, use_cuda=None):
        plan = None if schedule is None else (lambda step: torch.profiler.ProfilerAction[schedule(step).name])
        self._torch = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], schedule=plan,
            on_trace_ready=None if on_trace_ready is None else (lambda _: on_trace_ready(self)),
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
            with_modules=with_modules)

    def start(self):
        self._torch.start()

    def stop(self):
        self._torch.stop()

    def step(self):
        self._torch.step()

    def export_chrome_trace(self, output_path: str):
        self._torch.export_chrome_trace(output_path)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc_val, exc_tb):
        self.stop()
