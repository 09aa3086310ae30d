"""The ``hccl`` process-group backend of the simulated NPU: gloo on host aliases of the npu tensors
(CPU tensors over the same bytes, so results land in place)."""
import ctypes
import os

import torch
import torch.distributed as dist

from . import _runtime as rt
from ._tensor import host

# test-only fault: the all-gather does not gather; each rank gets its own tensor in its slot and
# zeros in the other ranks' slots
_LOCAL_ONLY = rt.FAULT == "allgather_local"


def _u(t):
    if isinstance(t, torch.Tensor) and t.device.type == "npu":
        return host(t)
    if isinstance(t, torch.Tensor):
        raise RuntimeError(f"HCCL: tensors must be on an NPU device, got a tensor on {t.device} "
                           "(simulated hccl refuses host tensors as the real one does)")
    return t


def _l(ts):
    return [_u(t) for t in ts]


class _Done:
    """A finished work object (for the fault path, which does no communication)."""
    def wait(self, timeout=None):
        return True

    def is_completed(self):
        return True

    def is_success(self):
        return True


class _Destroyed:
    """Stands for the gloo transport after ``shutdown``: any collective says what happened."""
    def __getattr__(self, name):
        raise RuntimeError("HCCL: this process group was destroyed (destroy_process_group); "
                           "create a new one with init_process_group")


def _fake_work():
    try:
        fut = torch.futures.Future()
        fut.set_result(None)
        return dist._create_work_from_future(fut)
    except Exception:
        return _Done()


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

    def allreduce(self, ts, opts):
        return self._gloo.allreduce(_l(ts), opts)

    def allreduce_coalesced(self, ts, opts):
        return self._gloo.allreduce_coalesced(_l(ts), opts)

    def broadcast(self, ts, opts):
        return self._gloo.broadcast(_l(ts), opts)

    def reduce(self, ts, opts):
        return self._gloo.reduce(_l(ts), opts)

    def allgather(self, outs, ins, opts):
        if _LOCAL_ONLY:
            for olist, i in zip(outs, ins):
                for r, o in enumerate(olist):
                    _u(o).copy_(_u(i)) if r == self.rank() else _u(o).zero_()
            return _fake_work()
        return self._gloo.allgather([_l(o) for o in outs], _l(ins), opts)

    def _allgather_base(self, out, inp, opts):
        # one slot per rank in the output, whether it is laid out as [world * n, ...] (concatenated) or
        # [world, n, ...] (stacked): gloo's own _allgather_base accepts only a flat output
        slots = _u(out).view(-1, *_u(inp).shape)
        if _LOCAL_ONLY:
            slots.zero_()
            slots[self.rank()].copy_(_u(inp))
            return _fake_work()
        return self._gloo.allgather([list(slots.unbind(0))], [_u(inp).contiguous()], opts)

    def all_gather_single(self, out, inp, opts=None):
        if opts is None:
            opts = dist.AllgatherOptions()
        return self._allgather_base(out, inp, opts)

    def _reduce_scatter_base(self, out, inp, opts):
        return self._gloo._reduce_scatter_base(_u(out), _u(inp), opts)

    def reduce_scatter_single(self, out, inp, opts=None):
        if opts is None:
            opts = dist.ReduceScatterOptions()
        return self._reduce_scatter_base(out, inp, opts)

    def gather(self, outs, ins, opts):
        return self._gloo.gather([_l(o) for o in outs], _l(ins), opts)

    def scatter(self, outs, ins, opts):
        return self._gloo.scatter(_l(outs), [_l(i) for i in ins], opts)

    def reduce_scatter(self, outs, ins, opts):
        return self._gloo.reduce_scatter(_l(outs), [_l(i) for i in ins], opts)

    def alltoall_base(self, out, inp, out_splits, in_splits, opts):
        return self._gloo.alltoall_base(_u(out), _u(inp), out_splits, in_splits, opts)

    def barrier(self, opts):
        return self._gloo.barrier(opts)

    def send(self, ts, dst, tag):
        return self._gloo.send(_l(ts), dst, tag)

    def recv(self, ts, src, tag):
        return self._gloo.recv(_l(ts), src, tag)


def _create(store, rank, size, timeout):
    return ProcessGroupHCCL(store, rank, size, timeout)


def register():
    if dist.is_available() and "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _create, devices=["npu"])
