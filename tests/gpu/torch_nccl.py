"""PyTorch on topoccl's libnccl.so.2 (issue 7's real client).

torch.distributed's "nccl" backend with 2 processes sharing GPU 0 (NCCL itself refuses two ranks on one GPU;
topoccl allows it), run with topoccl's library preloaded in place of NVIDIA's:

    LD_PRELOAD=/path/to/topoccl/libnccl.so.2 python3 torch_nccl.py            # check
    LD_PRELOAD=/path/to/topoccl/libnccl.so.2 python3 torch_nccl.py --bench    # + all-reduce timings
    python3 torch_nccl.py --bench --world 1                                     # NVIDIA's NCCL, 1 rank

Checks all_reduce, all_gather_into_tensor, reduce_scatter_tensor, broadcast, point-to-point (batch_isend_irecv,
send/recv) and all_to_all_single against a CPU reference computed
from every rank's (deterministic) input, exactly (small integers in float32), then trains a small model with
DistributedDataParallel for 20 steps and compares its weights with the same training on the CPU, where each
step's gradient is the mean of the ranks' gradients. Prints which libnccl the process mapped and "torch nccl:
PASSED" or "FAILED: ...". Exit code 0 only when everything matched.
"""
import argparse
import ctypes
import faulthandler
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_input(rank, n, step=0):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randint(-8, 9, (n,), generator=g).float()


def model_for(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def batch(rank, step):
    g = torch.Generator().manual_seed(77 + 31 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def library_in_use():
    """The libnccl files mapped, and whose ncclAllReduce the process's global lookup (what libtorch binds to,
    LD_PRELOAD first) finds: both libraries can be mapped, only one answers."""
    with open("/proc/self/maps") as maps:
        paths = sorted({line.split()[-1] for line in maps if "libnccl" in line})
    if not paths:
        return "(no libnccl mapped)"
    try:
        bound = ctypes.cast(ctypes.CDLL(None).ncclAllReduce, ctypes.c_void_p).value
    except AttributeError:  # nothing preloaded: torch's own libnccl is loaded locally, out of the global scope
        return ", ".join(paths) + "; ncclAllReduce is not in the global scope (libtorch_cuda binds its own libnccl)"
    owner = [p for p in paths if ctypes.cast(ctypes.CDLL(p).ncclAllReduce, ctypes.c_void_p).value == bound]
    return ", ".join(paths) + "; ncclAllReduce resolves to " + (owner[0] if owner else "(none of them)")


def worker(rank, world, port, bench, failures):
    if os.environ.get("TOPOCCL_TEST_STACKS_AFTER"):  # a hang shows where each process waits
        faulthandler.dump_traceback_later(float(os.environ["TOPOCCL_TEST_STACKS_AFTER"]), exit=False)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda:0"))
    errors = []

    def expect(name, got, want):
        if not torch.equal(got.cpu(), want):
            diff = (got.cpu() - want).abs().max().item()
            errors.append(f"rank {rank}: {name}: differs from the CPU reference (max |diff| {diff})")

    for n in (1, 4099, 1 << 20):
        inputs = [rank_input(r, n) for r in range(world)]
        t = inputs[rank].cuda()
        dist.all_reduce(t)
        expect(f"all_reduce of {n}", t, sum(inputs))
        out = torch.empty(world * n, device="cuda")
        dist.all_gather_into_tensor(out, inputs[rank].cuda())
        expect(f"all_gather of {n}", out, torch.cat(inputs))
        big = [rank_input(r, world * n, step=1) for r in range(world)]
        part = torch.empty(n, device="cuda")
        dist.reduce_scatter_tensor(part, big[rank].cuda())
        expect(f"reduce_scatter of {n}", part, sum(big)[rank * n:(rank + 1) * n])
        b = inputs[rank].cuda()
        dist.broadcast(b, src=world - 1)
        expect(f"broadcast of {n}", b, inputs[world - 1])

    # DDP against the CPU: every step's gradient is the mean over ranks (DDP's all-reduce).
    model = model_for(5).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step in range(20):
        x, y = batch(rank, step)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x.cuda()), y.cuda()).backward()
        opt.step()
    reference = model_for(5)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for step in range(20):
        ref_opt.zero_grad()
        grads = []
        for r in range(world):
            reference.zero_grad()
            x, y = batch(r, step)
            torch.nn.functional.mse_loss(reference(x), y).backward()
            grads.append([p.grad.clone() for p in reference.parameters()])
        for i, p in enumerate(reference.parameters()):
            p.grad = sum(g[i] for g in grads) / world
        ref_opt.step()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        if not torch.allclose(p.detach().cpu(), q.detach(), rtol=1e-4, atol=1e-5):
            errors.append(f"rank {rank}: DDP weight {name} differs from the CPU training "
                          f"(max |diff| {(p.detach().cpu() - q.detach()).abs().max().item():.3g})")

    # Point-to-point, pipeline parallelism's traffic: a ring by batch_isend_irecv, a blocking send/recv, and
    # all_to_all_single. After DDP: on 2026-11-26 (H100) the first ring hung here, so what comes before still runs.
    for n in (1, 4099, 1 << 20):
        got = torch.empty(n, device="cuda")
        ops = [dist.P2POp(dist.isend, rank_input(rank, n, step=2).cuda(), (rank + 1) % world),
               dist.P2POp(dist.irecv, got, (rank - 1) % world)]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        expect(f"batch_isend_irecv ring of {n}", got, rank_input((rank - 1) % world, n, step=2))
    if world > 1 and rank < 2:
        message = rank_input(0, 12347, step=3)
        if rank == 0:
            dist.send(message.cuda(), dst=1)
        else:
            got = torch.empty(12347, device="cuda")
            dist.recv(got, src=0)
            expect("send/recv", got, message)
    n = 1031
    got = torch.empty(world * n, device="cuda")
    dist.all_to_all_single(got, rank_input(rank, world * n, step=4).cuda())
    expect("all_to_all_single", got, torch.cat([rank_input(q, world * n, step=4)[rank * n:(rank + 1) * n] for q in range(world)]))

    if bench:
        for n in [2 ** k for k in range(1, 29, 3)]:
            t = torch.ones(n, device="cuda")
            for _ in range(5):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            start = time.perf_counter()
            iters = 20
            for _ in range(iters):
                dist.all_reduce(t)
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / iters
            busbw = 4 * n / seconds * (2 * (world - 1) / world if world > 1 else 1) / 1e9
            if rank == 0:
                print(f"bench world {world}: all_reduce {4 * n:>11} B  {seconds * 1e6:10.1f} us  busbw {busbw:8.2f} GB/s",
                      flush=True)

    if bench and world == 2:
        # Pipeline parallelism's traffic: rank 0 sends, rank 1 receives, one message at a time.
        for n in [2 ** k for k in range(1, 29, 3)]:
            t = torch.ones(n, device="cuda")
            for i in range(25):
                if i == 5:
                    torch.cuda.synchronize()
                    start = time.perf_counter()
                if rank == 0:
                    dist.send(t, dst=1)
                else:
                    dist.recv(t, src=0)
            torch.cuda.synchronize()
            seconds = (time.perf_counter() - start) / 20
            if rank == 1:
                print(f"bench world {world}: send/recv  {4 * n:>11} B  {seconds * 1e6:10.1f} us  bw {4 * n / seconds / 1e9:8.2f} GB/s",
                      flush=True)

    if rank == 0:
        print(f"rank 0 mapped: {library_in_use()}; torch.cuda.nccl.version() = {torch.cuda.nccl.version()}", flush=True)
    dist.destroy_process_group()
    for e in errors:
        print("FAILED:", e, flush=True)
    failures[rank] = len(errors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=2, help="processes, all on GPU 0")
    parser.add_argument("--bench", action="store_true", help="time all_reduce from 8 B to 1 GiB")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no GPU")
        return 77
    failures = mp.get_context("spawn").Array("i", args.world)
    mp.spawn(worker, args=(args.world, free_port(), args.bench, failures), nprocs=args.world, join=True)
    total = sum(failures)
    print("torch nccl: PASSED" if total == 0 else f"FAILED: {total} mismatches")
    return 0 if total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
