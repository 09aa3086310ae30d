"""NPU tensors of the simulated backend: a wrapper subclass (device ``npu:i``) around a host
tensor. ``__torch_dispatch__`` unwraps, runs the CPU kernel, and wraps the result again."""
import functools

import torch
from torch.utils._pytree import tree_map

from . import _runtime as rt

torch.utils.rename_privateuse1_backend("npu")


def npu_device(d=None):
    """Normalise ``d`` to ``torch.device('npu', i)``."""
    if d is None:
        return torch.device("npu", rt.current_device())
    if isinstance(d, int):
        return torch.device("npu", d)
    d = torch.device(d)
    return torch.device("npu", rt.current_device() if d.index is None else d.index)


def _bf16_refused(what):
    return RuntimeError(f"{what} not implemented for DT_BFLOAT16 on {rt.SOC} "
                        "(this SoC has no bfloat16 support; use float16)")


class NPUTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, elem, device):
        r = torch.Tensor._make_wrapper_subclass(
            cls, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
            dtype=elem.dtype, layout=elem.layout, device=device, requires_grad=elem.requires_grad)
        r._elem = elem
        st = elem.untyped_storage()
        r._skey = st._cdata
        rt.track(r._skey, st.nbytes(), device.index)
        return r

    def __del__(self):
        # no weakref.finalize: a weakref would stop nn.Module._apply from swapping tensors
        key = self.__dict__.get("_skey")
        if key is not None:
            rt.release(key)

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, **kwargs):
        body = repr(self._elem)
        return body[:-1] + f", device='{self.device}')" if body.endswith(")") else body

    def __reduce_ex__(self, proto):
        # pickled like torch pickles storage-less device tensors: a host copy + the device
        return (torch._utils._rebuild_device_tensor_from_cpu_tensor,
                (self._elem.detach().clone(), self.dtype, str(self.device), self.requires_grad))

    # traceable wrapper subclass protocol: nn.Module._apply then swaps tensors in place, so
    # Parameter objects keep their identity across model.to("npu")
    def __tensor_flatten__(self):
        return ["_elem"], {"device": self.device}

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        return NPUTensor(inner["_elem"], ctx["device"])

    # `t.data = other` swaps the tensor's contents (torch's set_data). A wrapper's contents live in its
    # host tensor `_elem`, which set_data cannot see: without this the new values were silently ignored
    # (DeepSpeed assigns `.data`, and trained wrong).
    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, value):
        torch._C.TensorBase.data.__set__(self, value)  # torch's own checks (type, device) and metadata
        if isinstance(value, NPUTensor):
            rt.release(self.__dict__.get("_skey"))
            self._elem = value._elem
            self._skey = value._elem.untyped_storage()._cdata
            rt.track(self._skey, value._elem.untyped_storage().nbytes(), self.device.index)

    def tolist(self):
        rt.lazy_init()
        return self._elem.tolist()

    def untyped_storage(self):
        return self._elem.untyped_storage()

    def data_ptr(self):
        return self._elem.data_ptr()

    def numpy(self, *, force=False):
        if force:
            return self._elem.numpy(force=True)
        raise TypeError(f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() "
                        "to copy the tensor to host memory first.")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _run(func, args, kwargs or {})


_MIXED_OK = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "index", "index_put_",
             "index_put", "_index_put_impl_", "set_", "_has_compatible_shallow_copy_type"}
_PY_KS = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
_NO_BF16 = not rt.BF16


def _run(func, args, kwargs):
    if rt.in_bad_fork:
        rt.lazy_init()   # raises "Cannot re-initialize NPU in forked subprocess"
    name = func._schema.name.split("::")[-1]
    if func.namespace == "_c10d_functional" and name in _FUNCTIONAL:
        return _functional_collective(name, args)
    if func.namespace == "c10d":
        # let c10d's PrivateUse1 kernels call the 'hccl' process group (which unwraps)
        with torch._C._ExcludeDispatchKeyGuard(_PY_KS):
            return func(*args, **kwargs)
    devs = set()
    host = []

    def scan(x):
        if isinstance(x, NPUTensor):
            devs.add(x.device)
            if _NO_BF16 and x.dtype == torch.bfloat16:
                raise _bf16_refused(str(func))
        elif isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dim() > 0:
            host.append(x)
    tree_map(scan, (args, kwargs))
    if name == "record_stream":  # kernels run synchronously on the host: no stream outlives a tensor's use
        return None
    if name not in _MIXED_OK:
        if len(devs) > 1:
            a, b = sorted(map(str, devs))[:2]
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                               f"devices, {a} and {b}! ({func})")
        if host and devs:
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                               f"devices, {next(iter(devs))} and cpu! ({func})")
    out_dev = next(iter(devs)) if devs else None
    if kwargs.get("device") is not None:
        d = torch.device(kwargs["device"])
        if d.type == "npu":
            out_dev = npu_device(d)
            rt.touch(out_dev.index)
        else:
            out_dev = None
        kwargs = dict(kwargs, device=torch.device("cpu"))
    if _NO_BF16 and kwargs.get("dtype") == torch.bfloat16 and out_dev is not None:
        raise _bf16_refused(str(func))
    uargs, ukwargs = tree_map(lambda x: x._elem if isinstance(x, NPUTensor) else x, (args, kwargs))
    if out_dev is not None and _draws_from_default(func, name, args, kwargs):
        out = _on_device_generator(out_dev.index, func, uargs, ukwargs)
    else:
        out = func(*uargs, **ukwargs)
    # in-place and out= ops return the very wrapper they were given
    rets = func._schema.returns
    if len(rets) == 1 and rets[0].alias_info is not None and rets[0].alias_info.is_write:
        given = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
        for a, v in zip(func._schema.arguments, given):
            if a.alias_info is not None and a.alias_info.is_write:
                if isinstance(v, NPUTensor) and (v.shape != v._elem.shape or v.stride() != v._elem.stride()):
                    _resync(v)  # the op resized its host tensor (an out= given empty: torch.arange(..., device="npu"))
                return v
    if out_dev is None:
        return out

    def wrap(x):
        if isinstance(x, torch.Tensor) and not isinstance(x, NPUTensor):
            if _NO_BF16 and x.dtype == torch.bfloat16:
                raise _bf16_refused(str(func))
            return NPUTensor(x, out_dev)
        return x
    return tree_map(wrap, out)


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
               "broadcast", "broadcast_"}  # the rest (_wrap_tensor_autograd, ...) run on the host tensors


# random kernels that take no generator argument (they draw from the default one)
_RANDOM_WITHOUT_GENERATOR = {"native_dropout", "rrelu_with_noise", "rrelu_with_noise_", "rrelu_with_noise_functional"}


def _draws_from_default(func, name, args, kwargs):
    """Whether the op draws random numbers from the default generator (none given)."""
    if name in _RANDOM_WITHOUT_GENERATOR:
        return True
    for i, a in enumerate(func._schema.arguments):
        if a.name == "generator":
            given = args[i] if i < len(args) else kwargs.get("generator")
            return given is None
    return False


def _on_device_generator(index, func, args, kwargs):
    """Run ``func`` on the host drawing from npu:``index``'s generator: the CPU generator's state is
    swapped for the device's and back, so the CPU's own stream of numbers is untouched."""
    cpu, dev = torch.default_generator, rt.generator(index)
    saved = cpu.get_state()
    cpu.set_state(dev.get_state())
    try:
        return func(*args, **kwargs)
    finally:
        dev.set_state(cpu.get_state())
        cpu.set_state(saved)


def _resync(t):
    """Give the wrapper ``t`` its host tensor's sizes and strides again (and count its storage anew)."""
    elem = t._elem
    torch._C.TensorBase.data.__set__(t, NPUTensor(elem, t.device))  # set_data: the metadata of a fresh wrapper
    t._elem = elem
    rt.release(t.__dict__.get("_skey"))
    t._skey = elem.untyped_storage()._cdata
    rt.track(t._skey, elem.untyped_storage().nbytes(), t.device.index)


# ---- kernels torch reaches with no npu tensor argument (factories, copies) --------------------
def _factory(op, *args, **kwargs):
    d = npu_device(kwargs.get("device"))
    rt.touch(d.index)
    if _NO_BF16 and kwargs.get("dtype") == torch.bfloat16:
        raise _bf16_refused(str(op))
    kwargs = dict(kwargs, device=torch.device("cpu"))
    kwargs.pop("pin_memory", None)
    return tree_map(lambda x: NPUTensor(x, d) if isinstance(x, torch.Tensor) else x, op(*args, **kwargs))


def _u(t):
    return t._elem if isinstance(t, NPUTensor) else t


def _copy_from(src, dst, non_blocking=False):
    _u(dst).copy_(_u(src))
    return dst


def _copy_from_and_resize(src, dst):
    _u(dst).resize_(src.shape).copy_(_u(src))
    return dst


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("empty.memory_format", functools.partial(_factory, torch.ops.aten.empty.memory_format), "PrivateUse1")
_LIB.impl("empty_strided", functools.partial(_factory, torch.ops.aten.empty_strided.default), "PrivateUse1")
_LIB.impl("_copy_from", _copy_from, "PrivateUse1")
_LIB.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")


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


# ---- serialization -------------------------------------------------------------------------------
# torch.load(map_location="npu") would build a storage on the device; storages of this backend
# live on the host, so keep them there and move the loaded tensors to the device afterwards.
def _restore(storage, location):
    return storage if str(location).startswith("npu") else None


torch.serialization.register_package(1, lambda obj: None, _restore)
_orig_load = torch.load


@functools.wraps(_orig_load)
def _load(f, map_location=None, *args, **kwargs):
    if callable(map_location):  # npu tensors are pickled through a host copy, which takes no callable: keep them there
        map_location = "cpu"
    out = _orig_load(f, map_location, *args, **kwargs)
    if isinstance(map_location, (str, torch.device)) and torch.device(map_location).type == "npu":
        d = npu_device(map_location)
        out = tree_map(lambda t: t.to(d) if isinstance(t, torch.Tensor) and t.device.type == "cpu" else t, out)
    return out


torch.load = _load


# ---- module conversion ---------------------------------------------------------------------------
# nn.Module._apply swaps a parameter with its converted self whenever it is a wrapper subclass (npu tensors
# are here; the real torch_npu's are not). `.to(device)` on a module already there gives an alias of each
# parameter (same data, device, dtype and layout) and swaps the two, which fails once a library holds a
# weakref on the parameter (DeepSpeed's engine does). Swapping a tensor with such an alias changes nothing:
# do nothing, as `.to()` on the real backend does.
_orig_swap = torch.utils.swap_tensors


def _same_view(t1, t2) -> bool:
    return t1 is t2 or (
        isinstance(t1, NPUTensor) and isinstance(t2, NPUTensor) and t1.device == t2.device and t1.dtype == t2.dtype
        and t1.shape == t2.shape and t1.stride() == t2.stride() and t1.data_ptr() == t2.data_ptr()
    )


@functools.wraps(_orig_swap)
def _swap_tensors(t1, t2):
    if _same_view(t1, t2):
        return None
    return _orig_swap(t1, t2)


torch.utils.swap_tensors = _swap_tensors
