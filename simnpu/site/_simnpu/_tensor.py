"""NPU tensors of the simulated backend. They are plain PrivateUse1 tensors made by the C++ part
(``simnpu/csrc/simnpu_tensor.cpp``: host memory counted against the card's capacity, a kernel fallback that
runs the CPU kernels on the same bytes); this module adds what torch leaves to Python: the device name,
autocast's policy (the functional collectives' kernels are in _hccl)."""
import torch
from torch.utils._pytree import tree_map

from . import _runtime  # noqa: F401  (the C++ part, loaded first: host_alias and the kernels are its)

torch.utils.rename_privateuse1_backend("npu")


def host(t):
    """A CPU tensor over the npu tensor ``t``'s bytes (writes to it land on the card)."""
    return torch.ops.simnpu.host_alias(t.detach())


# ---- conjugate / negative views (complex `conj()`, `_neg_view`): the npu copy kernel copies through host
# aliases that keep the conj / neg bits, and the CPU copy resolves them. Without these fallthroughs torch's math-op
# fallback materialises the source with a clone, whose copy lands in the same fallback again: endless recursion
# (a segmentation fault, seen with torch.fft.hfft on npu).
_VIEWS = torch.library.Library("aten", "IMPL")
for _key in ("Conjugate", "Negative"):
    for _op in ("_copy_from", "_copy_from_and_resize"):
        _VIEWS.impl(_op, torch.library.fallthrough_kernel, _key)


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
