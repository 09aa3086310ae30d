"""The ``hccl`` process-group backend of the simulated NPU: gloo on host aliases of the npu tensors
(CPU tensors over the same bytes, so results land in place).

Every collective the real ``ProcessGroupHCCL`` (torch_npu 2.9.0.post2, Ascend/pytorch commit
6fd1203f1b06b11cfd481cfc1366b0ca0d3b0379, torch_npu/csrc/distributed/ProcessGroupHCCL.cpp) implements is a method
here that gives the same result, or raises as that one raises (its reduce ops and data types). Collectives run to
completion before the method returns (the work handed back is already finished), so a result can never be read
before it has landed; point-to-point ``send`` / ``recv`` stay asynchronous, since a blocking send would deadlock a
ring. Any other method, and any op of torch's functional-collective namespaces this module does not run, raises an
error that names it and says it is not simulated: never a silent wrong answer."""
import ctypes
import os

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as C

from . import _runtime as rt
from ._tensor import host

# test-only fault: the all-gather does not gather; each rank gets its own tensor in its slot and
# zeros in the other ranks' slots
_LOCAL_ONLY = rt.FAULT == "allgather_local"

R = dist.ReduceOp
# ProcessGroupHCCL.cpp getHcclReduceOp / checkSupportedDataType
_UNSUPPORTED_OPS = {R.BAND: "BAND", R.BOR: "BOR", R.BXOR: "BXOR"}
_HCCL_DTYPES = {torch.int8: "int8", torch.int16: "int16", torch.int32: "int32", torch.float16: "fp16",
                torch.float32: "fp32", torch.bfloat16: "bfp16", torch.int64: "int64", torch.uint8: "uint8",
                torch.bool: "uint8", torch.float64: "fp64", torch.uint16: "uint16", torch.uint32: "uint32",
                torch.uint64: "uint64"}
_REDUCIBLE = {"int8", "int16", "int32", "fp16", "fp32", "bfp16", "int64"}


def not_simulated(what):
    return NotImplementedError(f"{what} is not simulated by the simulated NPU's hccl backend (simnpu): "
                               "it runs only on a real Ascend card")


def _u(t):
    if isinstance(t, torch.Tensor) and t.device.type == "npu":
        return host(t)
    if isinstance(t, torch.Tensor):
        raise RuntimeError(f"HCCL: tensors must be on an NPU device, got a tensor on {t.device} "
                           "(simulated hccl refuses host tensors as the real one does)")
    return t


def _l(ts):
    return [_u(t) for t in ts]


class _Finished:
    """A finished work object, where this torch has no ``_create_work_from_future``."""
    def __init__(self, fut):
        self._fut = fut

    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True

    def get_future(self):
        return self._fut

    def result(self):
        return self._fut.value()


def _done(value=None):
    """A finished work object whose future carries ``value`` (DDP's comm hooks read ``fut.value()``)."""
    fut = torch.futures.Future()
    fut.set_result(value)
    make = getattr(C, "_create_work_from_future", None)
    return make(fut) if make is not None else _Finished(fut)


def _kind(op):
    """The RedOpType of a ReduceOp (options carry a ReduceOp, callers pass a RedOpType)."""
    return getattr(op, "op", op)


def _check_reduce(fname, tensors, op, casts_bytes=False):
    """Raise where ProcessGroupHCCL raises: an unsupported data type (bool / uint8 are cast to int32 first by the
    allreduce and reduce family), BAND / BOR / BXOR, or a ReduceOp it does not handle (PREMUL_SUM)."""
    for t in tensors:
        name = _HCCL_DTYPES.get(t.dtype)
        if name is None:
            raise RuntimeError(f"HCCL {fname}: unsupported data type {t.dtype}")
        if casts_bytes and t.dtype in (torch.bool, torch.uint8):
            name = "int32"
        if name not in _REDUCIBLE:
            raise RuntimeError(f"HCCL {fname}: Unsupported data type {name}")
    op = _kind(op)
    if op in _UNSUPPORTED_OPS:
        raise RuntimeError(f"Cannot use ReduceOp.{_UNSUPPORTED_OPS[op]} with HCCL")
    if op not in (R.SUM, R.AVG, R.MAX, R.MIN, R.PRODUCT):
        raise RuntimeError("Unhandled ReduceOp")


def _gloo_op(op):
    """HCCL has no AVG: it sums, then divides by the group's size (as the real one does)."""
    return R.SUM if _kind(op) == R.AVG else op


def _average(work, op, size):
    """AVG's division after the sum, on the group's own copy: the real group divides in place (``div_``), which on a
    910B's integer tensor is a floor division (Ascend's test_allreduce expects ``expected //= world_size``; the
    real code truncates only on Ascend950); floating types divide."""
    if _kind(op) != R.AVG:
        return work
    if work.is_floating_point() or work.is_complex():
        return work.div_(size)
    return work.copy_(torch.div(work, size, rounding_mode="floor"))


class _Destroyed:
    """Stands for the gloo transport after ``shutdown``: any collective says what happened."""
    def __getattr__(self, name):
        raise RuntimeError("HCCL: this process group was destroyed (destroy_process_group); "
                           "create a new one with init_process_group")


def _quiet_gloo(store, rank, size, timeout):
    """Create the gloo group with the C stdout silenced: gloo of some torch versions (2.9) prints
    "[Gloo] Rank N is connected to ..." lines that real HCCL never prints, and they would land in
    the middle of the ranks' own output."""
    libc = ctypes.CDLL(None)
    # Only C stdio is flushed: Python's own buffered text stays in its buffer and reaches the restored
    # fd later. (A Python-level flush here would, in a rank forked from a Jupyter kernel, take
    # ipykernel's output lock, which a fork can leave held.)
    libc.fflush(None)
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        return dist.ProcessGroupGloo(dist.PrefixStore("simnpu_hccl", store), rank, size, timeout)
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class _BackendView:
    """What ``group._get_backend(npu)`` answers to Python callers (batch_isend_irecv, DeviceMesh, FSDP2): the
    backend's name, and no coalescing, splitting, time estimate or tensor allocation of its own."""
    supports_coalescing = supports_splitting = supports_time_estimate = False

    def name(self):
        return "hccl"

    def supports_tensor_alloc(self, device):
        return False


class ProcessGroupHCCL(dist.ProcessGroup):
    def __init__(self, store, rank, size, timeout):
        super().__init__(rank, size)
        self._gloo = _quiet_gloo(store, rank, size, timeout)

    def getBackendName(self):
        return "hccl"

    @property
    def group_name(self):
        """The name torch gave the group (DeviceMesh and the functional collectives look groups up by it); the C++
        base raises "ProcessGroup name not set" for a Python subclass."""
        import torch.distributed.distributed_c10d as c10d

        return c10d._world.pg_names[self]

    def shutdown(self):
        """``destroy_process_group`` calls this. The gloo transport underneath is released here, so its
        worker threads are joined now, while the interpreter is whole: a group still referenced (by a
        DDP model, say) otherwise keeps them alive into interpreter shutdown, where a worker dropping
        the last reference to a tensor needs the GIL and is ended mid-destructor, and the rank aborts
        with "terminate called without an active exception". (Gloo of this torch has no shutdown of
        its own: its destructor is what joins the threads.)"""
        gloo, self._gloo = self._gloo, _Destroyed()
        del gloo

    @property
    def _device_types(self):
        return [torch.device("npu")]

    def _get_backend(self, device):
        if torch.device(device).type != "npu":
            raise RuntimeError(f"No backend type associated with device type {torch.device(device).type}")
        return _BackendView()

    # ---- reductions ------------------------------------------------------------------------------------------
    def _allreduce_one(self, t, op):
        """One tensor, reduced in place: bool / uint8 go through int32 (as HCCL casts them), AVG is a sum divided
        by the group's size."""
        h = _u(t)   # reduced in a copy: the caller's tensor changes only once the whole result is there
        work = h.clone() if t.dtype not in (torch.bool, torch.uint8) else h.to(torch.int32)
        opts = C.AllreduceOptions()
        opts.reduceOp = _gloo_op(op)
        self._gloo.allreduce([work], opts).wait()
        h.copy_(_average(work, op, self.size()))

    def allreduce(self, ts, opts=None, fname="allreduce"):
        op = opts.reduceOp if opts is not None else R.SUM
        _check_reduce(fname, ts, op, casts_bytes=True)
        for t in ts:
            self._allreduce_one(t, op)
        return _done(list(ts))

    def allreduce_coalesced(self, ts, opts=None):
        return self.allreduce(ts, opts, "allreduce_coalesced")

    def reduce(self, ts, opts):
        _check_reduce("reduce", ts, opts.reduceOp, casts_bytes=True)
        for t in ts:   # an all-reduce kept on the root only: the other ranks' tensors stay as they were
            tmp = t.clone()
            self._allreduce_one(tmp, opts.reduceOp)
            if self.rank() == opts.rootRank:
                t.copy_(tmp)
        return _done(list(ts))

    def _reduce_scatter_one(self, out, inp, op, fname):
        _check_reduce(fname, [inp], op)
        h = _u(inp).contiguous().clone()
        o = C.AllreduceOptions()
        o.reduceOp = _gloo_op(op)
        self._gloo.allreduce([h], o).wait()
        _average(h, op, self.size())
        n = _u(out).numel()
        if h.numel() != n * self.size():
            raise ValueError(f"HCCL {fname}: input size {h.numel()} is not the output size {n} times the group "
                             f"size {self.size()}")
        _u(out).copy_(h.reshape(-1)[self.rank() * n:(self.rank() + 1) * n].view(out.shape))

    def _reduce_scatter_base(self, out, inp, opts):
        self._reduce_scatter_one(out, inp, opts.reduceOp, "_reduce_scatter_base")
        return _done([out])

    def reduce_scatter_single(self, out, inp, opts=None):
        return self._reduce_scatter_base(out, inp, opts or C.ReduceScatterOptions())

    def reduce_scatter_tensor_coalesced(self, outs, ins, opts=None):
        opts = opts or C.ReduceScatterOptions()
        for o, i in zip(outs, ins):
            self._reduce_scatter_one(o, i, opts.reduceOp, "reduce_scatter_tensor_coalesced")
        return _done(list(outs))

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def reduce_scatter(self, outs, ins, opts):
        for o, ilist in zip(outs, ins):
            _check_reduce("reduce_scatter", ilist, opts.reduceOp)
            self._reduce_scatter_one(o, torch.cat([i.reshape(-1) for i in ilist]), opts.reduceOp, "reduce_scatter")
        return _done(list(outs))

    # ---- gathers and broadcasts ------------------------------------------------------------------------------
    def broadcast(self, ts, opts):
        self._gloo.broadcast(_l(ts), opts).wait()
        return _done(list(ts))

    def allgather(self, outs, ins, opts=None):
        opts = opts or C.AllgatherOptions()
        if _LOCAL_ONLY:
            for olist, i in zip(outs, ins):
                for r, o in enumerate(olist):
                    _u(o).copy_(_u(i)) if r == self.rank() else _u(o).zero_()
            return _done(outs)
        if any(len({o.shape for o in olist}) > 1 for olist in outs):
            return self._allgather_uneven(outs, ins)
        self._gloo.allgather([_l(o) for o in outs], _l(ins), opts).wait()
        return _done(outs)

    def _allgather_uneven(self, outs, ins):
        """A shape per rank: the real group runs HcclAllGatherV (or, without it, one broadcast per rank); gloo's
        allgather refuses ("invalid tensor size") and leaves the ranks hanging. Here: one broadcast per rank."""
        for olist, i in zip(outs, ins):
            mine = olist[self.rank()]
            if mine.numel() != i.numel():
                raise ValueError(f"HCCL allgather: this rank's output tensor has {mine.numel()} elements, its "
                                 f"input {i.numel()}")
            slots = [_u(o).clone(memory_format=torch.contiguous_format) for o in olist]
            slots[self.rank()].copy_(_u(i).reshape(mine.shape))
            for r, slot in enumerate(slots):
                b = C.BroadcastOptions()
                b.rootRank, b.rootTensor = r, 0
                self._gloo.broadcast([slot], b).wait()
            for o, slot in zip(olist, slots):
                _u(o).copy_(slot)
        return _done(outs)

    def _allgather_base(self, out, inp, opts=None):
        # one slot per rank in the output, whether it is laid out as [world * n, ...] (concatenated) or
        # [world, n, ...] (stacked): gloo's own _allgather_base accepts only a flat output
        if _u(out).numel() != _u(inp).numel() * self.size():
            raise ValueError(f"HCCL _allgather_base: output size {out.numel()} is not the input size "
                             f"{inp.numel()} times the group size {self.size()}")
        slots = _u(out).view(-1, *_u(inp).shape)
        if _LOCAL_ONLY:
            slots.zero_()
            slots[self.rank()].copy_(_u(inp))
            return _done([out])
        self._gloo.allgather([list(slots.unbind(0))], [_u(inp).contiguous()],
                             opts or C.AllgatherOptions()).wait()
        return _done([out])

    def all_gather_single(self, out, inp, opts=None):
        return self._allgather_base(out, inp, opts)

    def allgather_into_tensor_coalesced(self, outs, ins, opts=None):
        for o, i in zip(outs, ins):
            self._allgather_base(o, i, opts)
        return _done(list(outs))

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def allgather_coalesced(self, outs, ins, opts=None):
        """``outs[r][i]`` receives rank r's ``ins[i]``."""
        for i, t in enumerate(ins):
            self.allgather([[o[i] for o in outs]], [t], opts)
        return _done(outs)

    def gather(self, outs, ins, opts):
        # the real torch_npu runs dist.gather as an all-gather (its Python patch); the result is the same
        self._gloo.gather([_l(o) for o in outs], _l(ins), opts).wait()
        return _done(outs)

    def scatter(self, outs, ins, opts):
        self._gloo.scatter(_l(outs), [_l(i) for i in ins], opts).wait()
        return _done(list(outs))

    # ---- all-to-all ------------------------------------------------------------------------------------------
    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        self._gloo.alltoall_base(_u(out), _u(inp).contiguous(), list(out_splits), list(in_splits),
                                 opts or C.AllToAllOptions()).wait()
        return _done([out])

    def all_to_all_single(self, out, inp, out_splits, in_splits, opts=None):
        return self.alltoall_base(out, inp, out_splits, in_splits, opts)

    def alltoall(self, outs, ins, opts=None):
        """Each rank's i-th input goes to rank i: one flat all-to-all over the concatenated inputs."""
        flat_in = torch.cat([_u(i).reshape(-1) for i in ins])
        flat_out = torch.empty(sum(o.numel() for o in outs), dtype=flat_in.dtype)
        self._gloo.alltoall_base(flat_out, flat_in, [o.numel() for o in outs], [i.numel() for i in ins],
                                 opts or C.AllToAllOptions()).wait()
        for o, piece in zip(outs, flat_out.split([o.numel() for o in outs])):
            _u(o).copy_(piece.view(o.shape))
        return _done(list(outs))

    # ---- point to point, barrier, coalescing -----------------------------------------------------------------
    def send(self, ts, dst, tag):
        return self._gloo.send(_l(ts), dst, tag)

    def recv(self, ts, src, tag):
        return self._gloo.recv(_l(ts), src, tag)

    def recv_anysource(self, ts, tag):
        raise RuntimeError("ProcessGroupHCCL does not support recv")   # the real message (recv from any source)

    def barrier(self, opts=None):
        self._gloo.barrier(opts or C.BarrierOptions()).wait()
        return _done(None)

    def _start_coalescing(self, device):
        pass   # every collective here completes when it is called: nothing to batch

    def _end_coalescing(self, device):
        return _done(None)

    # ---- what the real ProcessGroupHCCL lacks, or this one does not run ----------------------------------------
    def gather_into_tensor(self, *args, **kwargs):
        raise not_simulated("gather_into_tensor")

    def gather_single(self, *args, **kwargs):
        raise not_simulated("gather_single")

    def monitored_barrier(self, *args, **kwargs):
        raise not_simulated("monitored_barrier")


def _create(store, rank, size, timeout):
    return ProcessGroupHCCL(store, rank, size, timeout)


# ---- torch's functional collectives (DTensor, FSDP2, get_state_dict, torch.compile'd collectives) -------------
# They find the group by name and would call its C++ backend for the device type; the hccl group here is a Python
# ProcessGroup, so npu kernels run them with its methods. Every op of these namespaces gets an npu kernel: the ones
# below run the collective to completion (wait_tensor then has nothing to wait for); any other one raises by name.
_FUNCTIONAL_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional", "_dtensor",
                          "symm_mem")


def _group(name):
    import torch.distributed.distributed_c10d as c10d

    return c10d._resolve_process_group(name)


def _rop(name):
    return {"sum": R.SUM, "avg": R.AVG, "max": R.MAX, "min": R.MIN, "product": R.PRODUCT, "premul_sum": R.PREMUL_SUM,
            "band": R.BAND, "bor": R.BOR, "bxor": R.BXOR}[name.lower()]


def _all_reduce(ts, op, group):
    o = C.AllreduceOptions()
    o.reduceOp = _rop(op)
    _group(group).allreduce_coalesced(ts, o)
    return ts


def _all_gather(inp, size, group, out=None):
    if out is None:
        out = inp.new_empty((size * inp.shape[0], *inp.shape[1:]))
    _group(group)._allgather_base(out, inp.contiguous())
    return out


def _reduce_scatter(inp, op, size, group, out=None):
    if out is None:
        out = inp.new_empty((inp.shape[0] // size, *inp.shape[1:]))
    o = C.ReduceScatterOptions()
    o.reduceOp = _rop(op)
    _group(group)._reduce_scatter_base(out, inp.contiguous(), o)
    return out


def _all_to_all_single(inp, out_splits, in_splits, group):
    g = _group(group)
    out_splits, in_splits = [int(s) for s in out_splits], [int(s) for s in in_splits]
    if not out_splits:   # equal splits: the first dimension divided by the group's size
        out_splits = in_splits = [inp.shape[0] // g.size()] * g.size()
    out = inp.new_empty((sum(out_splits), *inp.shape[1:]))
    g.alltoall_base(out, inp.contiguous(), out_splits, in_splits)
    return out


def _broadcast(t, src, group):
    o = C.BroadcastOptions()
    o.rootRank = src
    _group(group).broadcast([t], o)
    return t


FUNCTIONAL = {
    "_c10d_functional::wait_tensor": lambda t: t,
    "_c10d_functional::all_reduce": lambda t, op, g: _all_reduce([t.clone()], op, g)[0],
    "_c10d_functional::all_reduce_": lambda t, op, g: _all_reduce([t], op, g)[0],
    "_c10d_functional::all_reduce_coalesced": lambda ts, op, g: _all_reduce([t.clone() for t in ts], op, g),
    "_c10d_functional::all_reduce_coalesced_": lambda ts, op, g: _all_reduce(list(ts), op, g),
    "_c10d_functional::all_gather_into_tensor": _all_gather,
    "_c10d_functional::all_gather_into_tensor_out": lambda t, size, g, *, out: _all_gather(t, size, g, out),
    "_c10d_functional::all_gather_into_tensor_coalesced": lambda ts, size, g: [_all_gather(t, size, g) for t in ts],
    "_c10d_functional::reduce_scatter_tensor": _reduce_scatter,
    "_c10d_functional::reduce_scatter_tensor_out":
        lambda t, op, size, g, *, out: _reduce_scatter(t, op, size, g, out),
    "_c10d_functional::reduce_scatter_tensor_coalesced":
        lambda ts, op, size, g: [_reduce_scatter(t, op, size, g) for t in ts],
    "_c10d_functional::all_to_all_single": _all_to_all_single,
    "_c10d_functional::broadcast": lambda t, src, g: _broadcast(t.clone(), src, g),
    "_c10d_functional::broadcast_": _broadcast,
}


def _refusing(qualname):
    def kernel(*args, **kwargs):
        raise not_simulated(f"torch.ops.{qualname.replace('::', '.')}")
    return kernel


_LIBS = {}


def _register_functional():
    names = sorted({s.name for s in torch._C._jit_get_all_schemas()
                    if s.name.split("::")[0] in _FUNCTIONAL_NAMESPACES})
    for qualname in names:
        ns, op = qualname.split("::")
        if ns == "_c10d_functional_autograd" or (ns == "_dtensor" and op == "shard_dim_alltoall"):
            continue   # composite: they call the _c10d_functional ops above (with autograd), which run here
        lib = _LIBS.setdefault(ns, torch.library.Library(ns, "IMPL"))
        lib.impl(op, FUNCTIONAL.get(qualname) or _refusing(qualname), "PrivateUse1")


def register():
    if dist.is_available() and "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _create, devices=["npu"])
        _register_functional()
