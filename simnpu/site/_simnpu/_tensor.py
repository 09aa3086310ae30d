"""NPU tensors of the simulated backend. They are plain PrivateUse1 tensors made by the C++ part
(``simnpu/csrc/simnpu_tensor.cpp``: host memory counted against the card's capacity, a kernel fallback that
runs the CPU kernels on the same bytes); this module adds what torch leaves to Python: the device name,
autocast's policy and the functional collectives' kernels."""
import torch
from torch.utils._pytree import tree_map

from . import _runtime  # noqa: F401  (the C++ part, loaded first: host_alias and the kernels are its)

torch.utils.rename_privateuse1_backend("npu")


def host(t):
    """A CPU tensor over the npu tensor ``t``'s bytes (writes to it land on the card)."""
    return torch.ops.simnpu.host_alias(t.detach())


def _functional_collective(name, args):
    """torch's functional collectives (DTensor, FSDP2, get_state_dict) find the group by name and call its C++
    backend for the device type; the hccl group here is a Python ProcessGroup, so they are run by its methods."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch._C import _distributed_c10d as C

    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "product": dist.ReduceOp.PRODUCT}
    if name == "wait_tensor":
        return args[0]
    if name == "all_gather_into_tensor":
        inp, size, group = args[:3]
        out = inp.new_empty((size * inp.shape[0], *inp.shape[1:]))
        c10d._resolve_process_group(group)._allgather_base(out, inp.contiguous(), C.AllgatherOptions()).wait()
        return out
    if name == "reduce_scatter_tensor":
        inp, op, size, group = args[:4]
        out = inp.new_empty((inp.shape[0] // size, *inp.shape[1:]))
        opts = C.ReduceScatterOptions()
        opts.reduceOp = ops[op.lower()]
        c10d._resolve_process_group(group)._reduce_scatter_base(out, inp.contiguous(), opts).wait()
        return out
    if name in ("all_reduce", "all_reduce_"):
        inp, op, group = args[:3]
        out = inp if name.endswith("_") else inp.clone()
        opts = C.AllreduceOptions()
        opts.reduceOp = ops[op.lower()]
        c10d._resolve_process_group(group).allreduce([out], opts).wait()
        return out
    if name in ("broadcast", "broadcast_"):
        inp, src, group = args[:3]
        out = inp if name.endswith("_") else inp.clone()
        opts = C.BroadcastOptions()
        opts.rootRank = src
        c10d._resolve_process_group(group).broadcast([out], opts).wait()
        return out
    raise AssertionError(name)  # _FUNCTIONAL lists the names handled above


_FUNCTIONAL = {"wait_tensor", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce", "all_reduce_",
               "broadcast", "broadcast_"}


def _functional_kernel(name):
    return lambda *args: _functional_collective(name, args)


_FC = torch.library.Library("_c10d_functional", "IMPL")
for _name in _FUNCTIONAL:
    _FC.impl(_name, _functional_kernel(_name), "PrivateUse1")



# ---- autocast("npu"): core registers no policy for AutocastPrivateUse1 --------------------------
_FALLBACK = torch.library.Library("_", "IMPL")
try:
    _FALLBACK.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
except RuntimeError:
    pass   # a fallthrough is already registered by this torch
_AC = torch.library.Library("aten", "IMPL")
_AC_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
# ops autocast runs in the lower precision (the CUDA "lower_precision_fp" list, abridged)
LOWER = ["mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "conv1d", "conv2d",
         "conv3d", "_convolution", "prelu", "addmv", "addr", "chain_matmul", "scaled_dot_product_attention"]


# ops autocast runs in float32 whatever the autocast dtype (the CUDA "fp32" and "fp32_set_opt_dtype" lists, abridged:
# the ones a training step meets); torch_npu keeps them in float32 too
FP32 = ["softmax.int", "log_softmax.int", "_softmax", "_log_softmax", "layer_norm", "native_layer_norm", "group_norm",
        "nll_loss", "nll_loss_nd", "nll_loss2d", "cross_entropy_loss", "mse_loss", "l1_loss", "smooth_l1_loss",
        "huber_loss", "kl_div", "binary_cross_entropy_with_logits", "cosine_similarity", "exp", "log", "log_softmax",
        "pow.Tensor_Scalar", "pow.Tensor_Tensor", "rsqrt", "reciprocal", "logsumexp", "cumsum", "norm.Scalar",
        "linalg_vector_norm", "sum.dim_IntList", "prod"]


def _fp32_kernel(opname):
    name, _, overload = opname.partition(".")

    def kernel(*args, **kwargs):
        def cast(x):
            if isinstance(x, torch.Tensor) and x.dtype in (torch.float16, torch.bfloat16):
                return x.float()
            return x
        op = getattr(torch.ops.aten, name)
        with torch._C._ExcludeDispatchKeyGuard(_AC_KS):
            return getattr(op, overload or "default")(*tree_map(cast, args), **tree_map(cast, kwargs))
    return kernel


def _autocast_kernel(opname):
    def kernel(*args, **kwargs):
        dt = torch.get_autocast_dtype("npu")

        def cast(x):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dt:
                return x.to(dt)
            return x
        with torch._C._ExcludeDispatchKeyGuard(_AC_KS):
            return getattr(torch.ops.aten, opname)(*tree_map(cast, args), **tree_map(cast, kwargs))
    return kernel


for _op in LOWER:
    try:
        _AC.impl(_op, _autocast_kernel(_op), "AutocastPrivateUse1")
    except Exception:
        pass   # op absent or already registered in this torch
for _op in FP32:
    try:
        _AC.impl(_op, _fp32_kernel(_op), "AutocastPrivateUse1")
    except Exception:
        pass
