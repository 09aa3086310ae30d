"""simnpu's hccl: every collective gives gloo's answer on CPU tensors, or raises as the real hccl raises, or raises
naming the op as not simulated. Never a silent wrong answer.

One spawn per world size (2 and 3 ranks, real processes): each rank runs every case below REPEATS times, once with
the gloo group on CPU tensors and once with the hccl group on npu tensors, and reports what differed. Run as a
script (``python tests/test_simnpu_collectives.py RANK WORLD PORT``) this file is that rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

REPEATS = 2
NOT_SIMULATED = "is not simulated"


# ---- the cases (run in the ranks) --------------------------------------------------------------------------------
class Ctx:
    """One run of a case: the group, the device of its tensors, and rank-dependent inputs."""

    def __init__(self, group, dev, rank, world, rep):
        self.g, self.dev, self.rank, self.world, self.rep = group, dev, rank, world, rep

    def x(self, n=4, dtype=None, k=0, rank=None):
        import torch

        r = self.rank if rank is None else rank
        return (torch.arange(n) + 10 * r + 100 * self.rep + 1000 * k + 1).to(dtype or torch.float32).to(self.dev)

    @property
    def name(self):
        return self.g.group_name


def _cases():
    """name -> (run(ctx) -> result tensors, the error hccl must raise or None, expectation where gloo cannot)."""
    cases = {}

    def case(name, raises=None, expect=None):
        def add(fn):
            cases[name] = (fn, raises, expect)
            return fn
        return add

    for add in (_reductions, _gathers_and_all_to_all, _coalesced_p2p_objects, _functional):
        add(case)
    return cases


def _waited(w, *ts):
    if w is not None:
        w.wait()
    return list(ts)


def _reductions(case):
    import torch
    import torch.distributed as dist

    R, waited = dist.ReduceOp, _waited
    for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):
        for async_op in (False, True):
            def ar(c, op=op, async_op=async_op):
                t = c.x() if op != "PRODUCT" else (c.x() % 3 + 1)
                return waited(dist.all_reduce(t, op=getattr(R, op), group=c.g, async_op=async_op), t)
            avg = (lambda c: [sum(c.x(rank=r).cpu() for r in range(c.world)) / c.world]) if op == "AVG" else None
            case(f"all_reduce {op} async={async_op}", expect=avg)(ar)
    for dt in ("int64", "int32", "float16", "bfloat16", "uint8", "bool"):
        def ar_dt(c, dt=dt):
            t = c.x(dtype=getattr(torch, dt)) if dt != "bool" else (c.x() % (c.rank + 2) == 0)
            return waited(dist.all_reduce(t, group=c.g), t)
        case(f"all_reduce SUM {dt}", expect=(lambda c: [torch.stack(
            [(c.x(rank=r).cpu() % (r + 2) == 0) for r in range(c.world)]).any(0)]) if dt == "bool" else None)(ar_dt)
    case("all_reduce SUM float64", raises="HCCL allreduce: Unsupported data type fp64")(
        lambda c: waited(dist.all_reduce(c.x(dtype=torch.float64), group=c.g)))
    for op in ("BAND", "BOR", "BXOR"):
        case(f"all_reduce {op}", raises=f"Cannot use ReduceOp.{op} with HCCL")(
            lambda c, op=op: waited(dist.all_reduce(c.x(dtype=torch.int32), op=getattr(R, op), group=c.g)))
    # integer AVG: HCCL sums, then the card's div_ floors (Ascend's test_allreduce: `expected //= world_size`);
    # negative sums that the group's size does not divide tell floor from truncation. uint8 is summed as int32.
    def ints(c, dt, rank=None, n=4):
        r = c.rank if rank is None else rank
        return ((c.x(n, dtype=torch.int32, rank=r) % 50) * (r + 1) - (0 if dt == "uint8" else 250)).to(
            getattr(torch, dt))
    for dt in ("int32", "int64", "uint8"):
        case(f"all_reduce AVG {dt}", expect=lambda c, dt=dt: [torch.div(sum(
            ints(c, dt, r).cpu().to(torch.int32) for r in range(c.world)), c.world, rounding_mode="floor").to(
                getattr(torch, dt))])(lambda c, dt=dt: waited(dist.all_reduce(t := ints(c, dt), op=R.AVG, group=c.g), t))

    def refused_untouched(c, dt, op):   # a refusal leaves the caller's tensor as it was, on every rank
        t = c.x(dtype=getattr(torch, dt))
        try:
            dist.all_reduce(t, op=getattr(R, op), group=c.g)
        except RuntimeError as e:
            return [t] if "HCCL" in str(e) else []
        return []
    for dt, op in (("float64", "AVG"), ("int32", "BAND")):
        case(f"all_reduce {op} {dt} refused, input untouched", expect=lambda c, dt=dt: [c.x(dtype=getattr(torch, dt)).cpu()])(
            lambda c, dt=dt, op=op: refused_untouched(c, dt, op))
    case("all_reduce_coalesced (deprecated)")(lambda c: waited(
        dist.all_reduce_coalesced([a := c.x(), b := c.x(3, k=1)], group=c.g), a, b))


def _gathers_and_all_to_all(case):
    import torch
    import torch.distributed as dist

    R, waited = dist.ReduceOp, _waited
    for async_op in (False, True):
        case(f"broadcast async={async_op}")(lambda c, a=async_op: waited(
            dist.broadcast(t := c.x(), src=c.world - 1, group=c.g, async_op=a), t))
        case(f"reduce SUM async={async_op}")(lambda c, a=async_op: waited(
            dist.reduce(t := c.x(), dst=0, group=c.g, async_op=a), *([t] if c.rank == 0 else [])))
        case(f"all_gather async={async_op}")(lambda c, a=async_op: waited(
            dist.all_gather(outs := [c.x() for _ in range(c.world)], c.x(), group=c.g, async_op=a), *outs))
        case(f"all_gather_into_tensor async={async_op}")(lambda c, a=async_op: waited(
            dist.all_gather_into_tensor(o := torch.zeros(4 * c.world, device=c.dev), c.x(), group=c.g,
                                        async_op=a), o))
        case(f"reduce_scatter_tensor async={async_op}")(lambda c, a=async_op: waited(
            dist.reduce_scatter_tensor(o := torch.zeros(2, device=c.dev), c.x(2 * c.world), group=c.g,
                                       async_op=a), o))
        case(f"all_to_all_single equal async={async_op}")(lambda c, a=async_op: waited(
            dist.all_to_all_single(o := torch.zeros(2 * c.world, device=c.dev), c.x(2 * c.world), group=c.g,
                                   async_op=a), o))
    case("reduce AVG", expect=lambda c: [sum(c.x(rank=r).cpu() for r in range(c.world)) / c.world]
         if c.rank == 0 else [])(lambda c: waited(dist.reduce(t := c.x(), dst=0, op=R.AVG, group=c.g),
                                                  *([t] if c.rank == 0 else [])))
    case("all_gather_into_tensor stacked", expect=lambda c: [torch.stack([c.x(6, rank=r).view(2, 3).cpu()
                                                                          for r in range(c.world)])])(lambda c: waited(
        dist.all_gather_into_tensor(o := torch.zeros(c.world, 2, 3, device=c.dev), c.x(6).view(2, 3), group=c.g), o))
    case("all_gather_coalesced (deprecated)")(lambda c: waited(dist.all_gather_coalesced(
        outs := [[c.x(), c.x(3)] for _ in range(c.world)], [c.x(), c.x(3, k=1)], group=c.g),
        *[t for o in outs for t in o]))
    case("reduce_scatter list", expect=lambda c: [sum(c.x(2, k=c.rank, rank=r).cpu() for r in range(c.world))])(
        lambda c: waited(dist.reduce_scatter(o := torch.zeros(2, device=c.dev),
                                             [c.x(2, k=j) for j in range(c.world)], group=c.g), o))
    case("reduce_scatter_tensor AVG",
         expect=lambda c: [sum(c.x(2 * c.world, rank=r).cpu() for r in range(c.world))[2 * c.rank:2 * c.rank + 2]
                           / c.world])(
        lambda c: waited(dist.reduce_scatter_tensor(o := torch.zeros(2, device=c.dev), c.x(2 * c.world),
                                                    op=R.AVG, group=c.g), o))
    def ints(c, rank=None):   # as for all_reduce AVG: negative sums the group's size does not divide
        r = c.rank if rank is None else rank
        return (c.x(2 * c.world, dtype=torch.int32, rank=r) % 50) * (r + 1) - 250
    case("reduce_scatter_tensor AVG int32", expect=lambda c: [torch.div(sum(
        ints(c, r).cpu() for r in range(c.world))[2 * c.rank:2 * c.rank + 2], c.world, rounding_mode="floor")])(
        lambda c: waited(dist.reduce_scatter_tensor(o := torch.zeros(2, dtype=torch.int32, device=c.dev), ints(c),
                                                    op=R.AVG, group=c.g), o))
    for async_op in (False, True):   # a shape per rank: torch_npu runs HcclAllGatherV (gloo: "invalid tensor size")
        case(f"all_gather uneven async={async_op}", expect=lambda c: [c.x(r + 1, rank=r).view(1, r + 1).cpu()
                                                                      for r in range(c.world)])(
            lambda c, a=async_op: waited(dist.all_gather(outs := [torch.zeros(1, r + 1, device=c.dev)
                                                                  for r in range(c.world)],
                                                         c.x(c.rank + 1).view(1, c.rank + 1), group=c.g, async_op=a),
                                         *outs))


def _coalesced_p2p_objects(case):
    import torch
    import torch.distributed as dist

    waited = _waited
    for async_ops in (False, True):
        def cm(c, body, async_ops=async_ops):
            # gloo implements no startCoalescing: it is given no device (the fast path only)
            device = None if c.dev == "cpu" else torch.device(c.dev)
            with dist._coalescing_manager(group=c.g, device=device, async_ops=async_ops) as m:
                out = body()
            if async_ops:
                m.wait()
            return out
        case(f"coalesced all_gather_into_tensor async={async_ops}")(lambda c, cm=cm: cm(c, lambda: [
            o for o, i in [(torch.zeros(4 * c.world, device=c.dev), c.x()),
                           (torch.zeros(2 * c.world, device=c.dev), c.x(2, k=1))]
            if dist.all_gather_into_tensor(o, i, group=c.g) or True]))
        case(f"coalesced all_reduce async={async_ops}")(lambda c, cm=cm: cm(c, lambda: [
            t for t in (c.x(), c.x(3, k=1)) if dist.all_reduce(t, group=c.g) or True]))
        case(f"coalesced reduce_scatter_tensor async={async_ops}")(lambda c, cm=cm: cm(c, lambda: [
            o for o, i in [(torch.zeros(2, device=c.dev), c.x(2 * c.world)),
                           (torch.zeros(1, device=c.dev), c.x(c.world, k=1))]
            if dist.reduce_scatter_tensor(o, i, group=c.g) or True]))
    for async_op in (False, True):
        case(f"all_to_all equal async={async_op}")(lambda c, a=async_op: waited(dist.all_to_all(
            outs := [torch.zeros(2, device=c.dev) for _ in range(c.world)], [c.x(2, k=j) for j in range(c.world)],
            group=c.g, async_op=a), *outs))
        case(f"all_to_all uneven async={async_op}", expect=lambda c: [  # gloo: equal sizes only
            c.x(i + c.rank + 1, k=c.rank, rank=i).cpu() for i in range(c.world)])(lambda c, a=async_op: waited(dist.all_to_all(
            outs := [torch.zeros(i + c.rank + 1, device=c.dev) for i in range(c.world)],
            [c.x(c.rank + j + 1, k=j) for j in range(c.world)], group=c.g, async_op=a), *outs))
        case(f"all_to_all_single uneven async={async_op}")(lambda c, a=async_op: waited(dist.all_to_all_single(
            o := torch.zeros(sum(i + c.rank + 1 for i in range(c.world)), device=c.dev),
            c.x(sum(c.rank + j + 1 for j in range(c.world))), [i + c.rank + 1 for i in range(c.world)],
            [c.rank + j + 1 for j in range(c.world)], group=c.g, async_op=a), o))
    if hasattr(dist, "all_gather_single"):   # torch >= 2.11's names
        case("all_gather_single")(lambda c: waited(
            dist.all_gather_single(o := torch.zeros(4 * c.world, device=c.dev), c.x(), group=c.g), o))
        case("reduce_scatter_single")(lambda c: waited(
            dist.reduce_scatter_single(o := torch.zeros(2, device=c.dev), c.x(2 * c.world), group=c.g), o))
        case("gather_into_tensor", raises=f"gather_single {NOT_SIMULATED}")(lambda c: waited(
            dist.gather_into_tensor(torch.zeros(4 * c.world, device=c.dev), c.x(), dst=0, group=c.g)))
    case("gather")(lambda c: waited(dist.gather(c.x(), outs := [c.x() for _ in range(c.world)] if c.rank == 0
                                                else None, dst=0, group=c.g), *(outs or [])))
    case("scatter")(lambda c: waited(dist.scatter(o := torch.zeros(4, device=c.dev), [c.x(k=j) for j in range(
        c.world)] if c.rank == 0 else None, src=0, group=c.g), o))

    def ring(c):
        o = torch.zeros(4, device=c.dev)
        ws = [dist.isend(c.x(), (c.rank + 1) % c.world, group=c.g), dist.irecv(o, (c.rank - 1) % c.world, group=c.g)]
        for w in ws:
            w.wait()
        return [o]
    case("isend/irecv ring")(ring)

    def batch(c):
        o = torch.zeros(4, device=c.dev)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, c.x(), (c.rank + 1) % c.world, c.g),
                                          dist.P2POp(dist.irecv, o, (c.rank - 1) % c.world, c.g)]):
            w.wait()
        return [o]
    case("batch_isend_irecv ring")(batch)
    case("barrier")(lambda c: waited(dist.barrier(group=c.g)))

    def objects(c):
        got = [None] * c.world
        dist.all_gather_object(got, {"rank": c.rank, "rep": c.rep}, group=c.g)
        b = [c.rank * 7 + c.rep] if c.rank == 1 else [None]
        dist.broadcast_object_list(b, src=1, group=c.g)
        return [torch.tensor([d["rank"] * 10 + d["rep"] for d in got] + b, device=c.dev)]
    case("all_gather_object, broadcast_object_list")(objects)



def _functional(case):
    import torch
    import torch.distributed._functional_collectives as funcol

    F = torch.ops._c10d_functional
    # torch.ops._c10d_functional (DTensor, FSDP2, compiled graphs), and the funcol wrappers over them
    def wait(ts):
        return [F.wait_tensor(t) for t in ts]
    for op in ("sum", "avg", "max"):
        case(f"F.all_reduce {op}", expect=(lambda c: [sum(c.x(rank=r).cpu() for r in range(c.world)) / c.world])
             if op == "avg" else None)(lambda c, op=op: wait([F.all_reduce(c.x(), op, c.name)]))
    case("F.all_reduce_")(lambda c: wait([F.all_reduce_(c.x(), "sum", c.name)]))
    case("F.all_reduce_coalesced")(lambda c: wait(F.all_reduce_coalesced([c.x(), c.x(3, k=1)], "sum", c.name)))
    case("F.all_reduce_coalesced_")(lambda c: wait(F.all_reduce_coalesced_(ts := [c.x(), c.x(3, k=1)], "sum",
                                                                           c.name)) + ts)
    case("F.all_gather_into_tensor")(lambda c: wait([F.all_gather_into_tensor(c.x(), c.world, c.name)]))
    case("F.all_gather_into_tensor_out")(lambda c: wait([F.all_gather_into_tensor_out(
        c.x(), c.world, c.name, out=(o := torch.zeros(4 * c.world, device=c.dev)))]) + [o])
    case("F.all_gather_into_tensor_coalesced")(lambda c: wait(F.all_gather_into_tensor_coalesced(
        [c.x(), c.x(3, k=1)], c.world, c.name)))
    case("F.reduce_scatter_tensor")(lambda c: wait([F.reduce_scatter_tensor(c.x(2 * c.world), "sum", c.world,
                                                                             c.name)]))
    case("F.reduce_scatter_tensor_out")(lambda c: wait([F.reduce_scatter_tensor_out(
        c.x(2 * c.world), "sum", c.world, c.name, out=(o := torch.zeros(2, device=c.dev)))]) + [o])
    case("F.reduce_scatter_tensor_coalesced")(lambda c: wait(F.reduce_scatter_tensor_coalesced(
        [c.x(2 * c.world), c.x(c.world, k=1)], "sum", c.world, c.name)))
    case("F.all_to_all_single equal")(lambda c: wait([F.all_to_all_single(
        c.x(2 * c.world), [2] * c.world, [2] * c.world, c.name)]))
    case("F.all_to_all_single uneven")(lambda c: wait([F.all_to_all_single(
        c.x(sum(c.rank + j + 1 for j in range(c.world))), [i + c.rank + 1 for i in range(c.world)],
        [c.rank + j + 1 for j in range(c.world)], c.name)]))
    case("F.broadcast")(lambda c: wait([F.broadcast(c.x(), c.world - 1, c.name)]))
    case("F.broadcast_")(lambda c: wait([F.broadcast_(c.x(), c.world - 1, c.name)]))
    case("F.isend", raises=f"torch.ops._c10d_functional.isend {NOT_SIMULATED}")(
        lambda c: wait([F.isend(c.x(), (c.rank + 1) % c.world, 0, c.name)]))
    case("F.irecv", raises=f"torch.ops._c10d_functional.irecv {NOT_SIMULATED}")(
        lambda c: wait([F.irecv(c.x(), (c.rank - 1) % c.world, 0, c.name)]))
    case("funcol.all_reduce / all_gather_tensor / reduce_scatter_tensor / all_to_all_single")(lambda c: [
        funcol.all_reduce(c.x(), "sum", c.g).wait(), funcol.all_gather_tensor(c.x(), 0, c.g).wait(),
        funcol.reduce_scatter_tensor(c.x(2 * c.world), "sum", 0, c.g).wait(),
        funcol.all_to_all_single(c.x(2 * c.world), None, None, c.g).wait()])

    def autograd(c):
        x = c.x(2 * c.world).requires_grad_()
        outs = [funcol.all_gather_tensor_autograd(x, 0, c.g), funcol.reduce_scatter_tensor_autograd(x, "sum", 0, c.g),
                funcol.all_to_all_single_autograd(x, None, None, c.g)]
        outs = [funcol.wait_tensor(o) for o in outs]
        sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
        return [o.detach() for o in outs] + [x.grad]
    case("funcol *_autograd forward and backward")(autograd)
    case("_dtensor.shard_dim_alltoall")(lambda c: wait([torch.ops._dtensor.shard_dim_alltoall(
        c.x(2 * c.world * c.world).view(2 * c.world, c.world), 0, 1, c.name)]))


def _run(fn, ctx):
    import torch

    try:
        out = fn(ctx)
        return "ok", [t.detach() for t in out if isinstance(t, torch.Tensor)]
    except Exception as e:  # noqa: BLE001  (an error is a result here)
        return "raised", f"{type(e).__name__}: {e}"


def _same(want, got, dev):
    import torch

    if len(want) != len(got):
        return f"{len(got)} results, want {len(want)}"
    for w, g in zip(want, got):
        if g.device.type != torch.device(dev).type:
            return f"a result on {g.device}, want {dev}"
        if w.dtype != g.dtype or w.shape != g.shape or not torch.equal(w.cpu(), g.cpu()):
            return f"got {g.cpu().tolist()} ({g.dtype}), want {w.cpu().tolist()} ({w.dtype})"
    return None


def rank_main(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import torch
    import torch.distributed as dist

    torch.npu.set_device(rank)
    dist.init_process_group("hccl", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    gloo, hccl, dev = dist.new_group(backend="gloo"), dist.group.WORLD, f"npu:{rank}"
    failures, checked = [], 0
    for name, (fn, raises, expect) in _cases().items():
        for rep in range(REPEATS):
            checked += 1
            got = _run(fn, Ctx(hccl, dev, rank, world, rep))
            if raises:
                if got[0] != "raised" or raises not in got[1]:
                    failures.append(f"{name}: want an error '{raises}', got {got}")
                continue
            # where gloo cannot give the answer (it has no AVG, no uneven gather: it raises or hangs), the expectation
            want = _run(fn, Ctx(gloo, "cpu", rank, world, rep)) if expect is None else (
                "ok", expect(Ctx(gloo, "cpu", rank, world, rep)))
            if want[0] == "raised":
                failures.append(f"{name}: gloo raised ({want[1]}) and the case has no expectation")
                continue
            problem = got[1] if got[0] == "raised" else _same(want[1], got[1], dev)
            if problem:
                failures.append(f"{name} (repeat {rep}): {problem}")
        dist.barrier(group=gloo)
    print("RESULT " + json.dumps({"rank": rank, "checked": checked, "failures": failures}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(*map(int, sys.argv[1:4]))
    sys.exit(0)


# ---- the test (pytest) -------------------------------------------------------------------------------------------
import pytest  # noqa: E402
from test_simnpu import SITE, free_port, sim_env  # noqa: E402

pytest.importorskip("torch")


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_matches_gloo_or_refuses_by_name(world, tmp_path):
    env = sim_env(tmp_path, SIMNPU_CARDS=str(world), PYTHONPATH=os.pathsep.join([SITE, os.path.dirname(__file__)]))
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, str(r), str(world), str(port)], env=env, cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for r in range(world)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=150)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("a rank hung:\n" + "\n".join(q.communicate()[0][-2000:] for q in procs))
    results = [json.loads(line[7:]) for o in outs for line in o.splitlines() if line.startswith("RESULT ")]
    assert len(results) == world, "\n".join(o[-3000:] for o in outs)
    n_cases = len(_cases_names())
    for r in results:
        assert r["checked"] == n_cases * REPEATS
        assert r["failures"] == [], f"rank {r['rank']} of {world}:\n" + "\n".join(r["failures"])
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-2000:] for o in outs)


def _cases_names():
    return list(_cases())
