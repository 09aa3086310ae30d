"""``torch_npu.contrib.transfer_to_npu`` of the simulated NPU: ``import`` it and code written for CUDA runs on npu.

The same patches as the real module (torch_npu 2.9.0.post2 ``contrib/transfer_to_npu.py``), on the same lists:
``torch.cuda.*`` and ``torch.cuda.amp.*`` become ``torch.npu``'s names (those in its ``__all__``); ``Tensor.cuda`` /
``Module.cuda`` become ``.npu``; a "cuda" device (str, ``torch.device``, int for ``to``) given to the factory functions,
``Tensor.to`` / ``Module.to`` and ``torch.cuda``'s memory functions becomes "npu"; ``init_process_group``'s "nccl"
becomes "hccl"; ``torch.jit.script`` is switched off (with the real warning) and triton reported absent; the
profiler names become ``torch_npu.profiler``'s. Not patched here (the real module does): storages, FSDP1's
``__init__``, ``DeviceContext``, dynamo's trace rules and the third-party APIs of its ``apis_config.json``.
What no version translates: a device TYPE compared in the user's code (``t.device.type == "cuda"`` is False), CUDA
kernels (``.cu`` extensions, triton, flash-attn, apex), NCCL-only features, ``torch.backends.cudnn`` flags (no effect).
"""
import functools
import os
import types
import warnings

import torch
import torch._dynamo  # the real `import torch_npu` has loaded dynamo (and DTensor) before these patches
import torch.distributed.tensor
import torch.utils._triton

import torch_npu

warnings.filterwarnings(action='once')  # as the real module: its ImportWarning below is shown once

__all__ = []
torch_fn_white_list = ['logspace', 'randint', 'hann_window', 'rand', 'full_like', 'ones_like', 'rand_like', 'randperm',
                       'arange', 'frombuffer', 'normal', '_empty_per_channel_affine_quantized', 'empty_strided',
                       'empty_like', 'scalar_tensor', 'tril_indices', 'bartlett_window', 'ones', 'sparse_coo_tensor',
                       'randn', 'kaiser_window', 'tensor', 'triu_indices', 'as_tensor', 'zeros', 'randint_like', 'full',
                       'eye', '_sparse_csr_tensor_unsafe', 'empty', '_sparse_coo_tensor_unsafe', 'blackman_window',
                       'zeros_like', 'range', 'sparse_csr_tensor', 'randn_like', 'from_file',
                       '_cudnn_init_dropout_state', '_empty_affine_quantized', 'linspace', 'hamming_window',
                       'empty_quantized', '_pin_memory', 'autocast', 'load', "Generator", 'set_default_device']
torch_tensor_fn_white_list = ['new_empty', 'new_empty_strided', 'new_full', 'new_ones', 'new_tensor', 'new_zeros', 'to',
                              'pin_memory']
torch_module_fn_white_list = ['to', 'to_empty']
torch_cuda_fn_white_list = [
    'get_device_properties', 'get_device_name', 'get_device_capability', 'list_gpu_processes', 'set_device',
    'synchronize', 'mem_get_info', 'memory_stats', 'memory_summary', 'memory_allocated', 'max_memory_allocated',
    'reset_max_memory_allocated', 'memory_reserved', 'max_memory_reserved', 'reset_max_memory_cached',
    'reset_peak_memory_stats'
]
torch_distributed_fn_white_list = ['__init__']
device_kwargs_list = ['device', 'device_type', 'map_location', 'device_id']
is_available = torch.cuda.is_available


def _npu(device):
    """One device argument with "cuda" in it, as the real module rewrites it; anything else unchanged."""
    if isinstance(device, str) and 'cuda' in device:
        return device.replace('cuda', 'npu')
    if isinstance(device, torch.device) and 'cuda' in device.type:
        return torch.device(f'npu:{device.index}' if device.index is not None else 'npu')
    if isinstance(device, dict):
        return {(k.replace('cuda', 'npu') if isinstance(k, str) else k): (v.replace('cuda', 'npu') if isinstance(v, str)
                else v) for k, v in device.items()}
    return device


def _wrapper_cuda(fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        replace_int = fn.__name__ in ['to', 'to_empty']
        args = [f'npu:{a}' if replace_int and isinstance(a, int) and not isinstance(a, bool) else _npu(a) for a in args]
        for name in device_kwargs_list:
            if kwargs.get(name) is not None:
                kwargs[name] = f'npu:{kwargs[name]}' if type(kwargs[name]) is int else _npu(kwargs[name])
        return fn(*args, **kwargs)
    return decorated


def _wrapper_hccl(fn):
    @functools.wraps(fn)
    def decorated(*args, **kwargs):
        args = [a.replace('nccl', 'hccl') if isinstance(a, str) else a for a in args]
        if isinstance(kwargs.get('backend'), str):
            kwargs['backend'] = kwargs['backend'].replace('nccl', 'hccl')
        return fn(*args, **kwargs)
    return decorated


def _device_wrapper(enter_fn, white_list):
    for fn_name in white_list:
        fn = getattr(enter_fn, fn_name, None)
        if fn:
            setattr(enter_fn, fn_name, _wrapper_cuda(fn))


def _patch_module(dest: types.ModuleType, patch: types.ModuleType):
    """torch_npu._apply_patches for a module with __all__: each of its names set on the destination module."""
    for name in patch.__all__:
        setattr(dest, name, getattr(patch, name))


def _init():
    if os.getenv('RANK', '0') == '0':
        warnings.warn('The torch.Tensor.cuda and torch.nn.Module.cuda are replaced with torch.Tensor.npu and '
                      'torch.nn.Module.npu now..\nThe backend in torch.distributed.init_process_group set to hccl now..'
                      '\nThe torch.cuda.* and torch.cuda.amp.* are replaced with torch.npu.* and torch.npu.amp.* now..',
                      ImportWarning, stacklevel=2)
    _patch_module(torch.cuda, torch_npu.npu)
    _patch_module(torch.cuda.amp, torch_npu.npu.amp)
    _device_wrapper(torch.cuda, torch_cuda_fn_white_list)
    torch.cuda.device.__init__ = _wrapper_cuda(torch.cuda.device.__init__)
    import torch_npu.profiler as npu_profiler
    for name in ('profile', 'schedule', 'tensorboard_trace_handler', 'ProfilerAction'):
        setattr(torch.profiler, name, getattr(npu_profiler, name))
    _device_wrapper(torch, torch_fn_white_list)
    _device_wrapper(torch.Tensor, torch_tensor_fn_white_list)
    torch.Tensor.cuda = torch.Tensor.npu
    torch.Tensor.is_cuda = torch.Tensor.is_npu
    _device_wrapper(torch.nn.Module, torch_module_fn_white_list)
    torch.nn.Module.cuda = torch.nn.Module.npu
    torch.distributed.init_process_group = _wrapper_hccl(torch.distributed.init_process_group)
    _device_wrapper(torch.nn.parallel.DistributedDataParallel, torch_distributed_fn_white_list)
    warnings.warn('torch.jit.script and torch.jit.script_method will be disabled by transfer_to_npu, which currently '
                  'does not support them, if you need to enable them, please do not use transfer_to_npu.',
                  RuntimeWarning, stacklevel=2)
    torch.jit.script = lambda obj, optimize=None, _frames_up=0, _rcb=None, example_inputs=None: obj
    torch.jit.script_method = lambda fn: fn
    torch.utils._triton.has_triton = lambda: False


_init()
