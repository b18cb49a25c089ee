# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Async EPLB on the decode critical path: stock vLLM vs this tree, one run.

Each implementation runs in its own process group (PYTHONPATH pointing at its
vLLM tree) of forked CPU gloo ranks. Every rank drives the real EplbState and
async worker in a decode loop whose "forward" holds the GIL for Python work
(input preparation and sampling bookkeeping as real Python loops) and runs
torch ops, with one collective per step as decode has. Nothing sleeps.

Per rank it reports the decode step time (forward + EplbState.step() + the
step's collective) in steady state and during migrations, the collectives the
main thread issues inside EplbState.step() per migration step, the steps per
migration cycle, and the bytes EPLB holds or allocates on the weights' device.

Usage:
    python benchmarks/eplb_async_critical_path.py \
        --stock-tree /work/base034/.vstack/repo --patched-tree .
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "eplb_async_critical_path.json")


def _percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    idx = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[idx]


def _summary(values):
    return {
        "n": len(values),
        "p50_ms": 1e3 * _percentile(values, 50),
        "p99_ms": 1e3 * _percentile(values, 99),
        "max_ms": 1e3 * max(values) if values else float("nan"),
    }


# ---------------------------------------------------------------------------
# Rank side (runs under the implementation's PYTHONPATH)
# ---------------------------------------------------------------------------


def _forward(x, w, num_requests):
    """One decode step: Python input prep, torch ops, Python sampling."""
    import torch

    # Input preparation: per-request bookkeeping in Python (holds the GIL).
    positions = []
    for req in range(num_requests):
        seq = [req * 7 + i for i in range(24)]
        positions.append(sum(seq) % 4096)
    ids = torch.tensor(positions, dtype=torch.int64)
    # "Model": a few small torch ops.
    h = x + ids[: x.shape[0]].unsqueeze(1).to(x.dtype) * 1e-6
    for _ in range(4):
        h = torch.tanh(h @ w)
    # Sampling bookkeeping.
    probs = torch.softmax(h.sum(dim=1), dim=0)
    out = probs.argmax().item()
    stops = {}
    for req in range(num_requests):
        stops[req] = (out + req) % 13 == 0
    return h, stops


class _MainThreadCollectives:
    def __init__(self):
        import torch.distributed as dist
        import vllm.distributed.eplb.eplb_state as eplb_state_module
        from vllm.distributed.parallel_state import GroupCoordinator

        self.count = 0
        self.active = False
        self.thread = threading.current_thread()
        targets = [
            (dist, n)
            for n in ("all_reduce", "barrier", "broadcast", "all_gather", "send")
        ]
        targets += [
            (dist, "recv"),
            (dist, "batch_isend_irecv"),
            (eplb_state_module, "all_reduce"),
            (GroupCoordinator, "cpu_all_reduce_"),
        ]
        for owner, name in targets:
            setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, fn):
        def wrapper(*args, **kwargs):
            if self.active and threading.current_thread() is self.thread:
                self.count += 1
            return fn(*args, **kwargs)

        return wrapper


def _rank_scenario(rank, world_size, cfg):
    import torch
    import torch.distributed as dist
    from eplb_async_helpers import (
        FakeMoEModel,
        arm_trigger,
        make_eplb_state,
        model_state,
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    class _AllocBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0
            self.thread = threading.current_thread()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.utils._pytree import tree_leaves

            out = func(*args, **(kwargs or {}))
            if threading.current_thread() is self.thread:
                inputs = {
                    t.untyped_storage().data_ptr()
                    for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)
                }
                for t in tree_leaves(out):
                    if (
                        isinstance(t, torch.Tensor)
                        and t.device.type == "cpu"
                        and t.untyped_storage().data_ptr() not in inputs
                    ):
                        self.bytes += t.untyped_storage().nbytes()
            return out

    torch.manual_seed(0)
    specs = ((cfg["row_elems"], torch.bfloat16), (cfg["row_elems"] // 2, torch.uint8))
    model = FakeMoEModel(
        world_size,
        rank,
        num_layers=cfg["layers"],
        num_logical=cfg["logical"],
        num_physical=cfg["physical"],
        specs=specs,
    )
    kwargs = {}
    if cfg["staged_layers"] is not None:
        kwargs["async_staged_layers"] = cfg["staged_layers"]
    state = make_eplb_state(model, use_async=True, **kwargs)
    ms = model_state(state)
    eplb_bytes = sum(b.numel() * b.element_size() for b in ms.expert_buffer)
    for slot in getattr(ms, "staging_slots", [])[1:]:
        eplb_bytes += sum(b.numel() * b.element_size() for b in slot.buffers)
    state.start_async_loop()
    counter = _MainThreadCollectives()
    x = torch.randn(64, 128)
    w = torch.randn(128, 128) * 0.05
    steady, migration, collectives, cycles, alloc = [], [], [], [], 0

    def decode_step(record):
        nonlocal alloc
        t0 = time.perf_counter()
        _forward(x, w, cfg["requests"])
        counter.active, counter.count = True, 0
        mode = _AllocBytes()
        with mode:
            state.step()
        counter.active = False
        done = torch.tensor([int(ms.rebalanced)])
        dist.all_reduce(done)  # decode is collective: one per step
        elapsed = time.perf_counter() - t0
        if record is not None:
            record.append(elapsed)
        return int(done), counter.count, mode.bytes

    for _ in range(cfg["warmup"]):
        decode_step(None)
    for cycle in range(cfg["cycles"]):
        for _ in range(cfg["steady_steps"]):
            decode_step(steady)
        arm_trigger(state, seed=100 + cycle)
        decode_step(None)  # the trigger step: load all_reduce + rearrange()
        steps = 1
        while True:
            busy, count, nbytes = decode_step(migration)
            collectives.append(count)
            alloc = max(alloc, nbytes)
            steps += 1
            if busy == 0 or steps > 2000:
                break
        cycles.append(steps)
    return {
        "steady": steady,
        "migration": migration,
        "collectives_per_migration_step": sum(collectives) / max(1, len(collectives)),
        "steps_per_cycle": cycles,
        "eplb_buffer_bytes": eplb_bytes,
        "max_step_alloc_bytes": alloc,
    }


def _run_impl(name, cfg, out_path):
    sys.path.insert(0, os.path.join(cfg["patched_tree"], "tests/distributed/eplb"))
    import vllm
    from eplb_async_helpers import run_ranks

    results = run_ranks(cfg["ranks"], _rank_scenario, timeout_s=600, cfg=cfg)
    with open(out_path, "w") as f:
        json.dump({"impl": name, "vllm": vllm.__file__, "ranks": results}, f)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _launch(name, tree, staged_layers, args, tmp):
    cfg = {
        "ranks": args.ranks,
        "layers": args.layers,
        "logical": args.logical,
        "physical": args.physical,
        "row_elems": args.row_elems,
        "requests": args.requests,
        "warmup": args.warmup,
        "steady_steps": args.steady_steps,
        "cycles": args.cycles,
        "staged_layers": staged_layers,
        "patched_tree": os.path.abspath(args.patched_tree),
    }
    out = os.path.join(tmp, f"{name}.json")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), VLLM_TARGET_DEVICE="cpu")
    code = (
        f"import json, sys; sys.path.insert(0, {HERE!r}); "
        "import eplb_async_critical_path as b; "
        f"b._run_impl({name!r}, json.loads({json.dumps(cfg)!r}), {out!r})"
    )
    # Run outside both trees, so only PYTHONPATH decides which vLLM loads.
    subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, timeout=900, cwd=tmp
    )
    with open(out) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stock-tree", required=True, help="a vLLM tree at stock 0.34.0"
    )
    parser.add_argument("--patched-tree", default=os.path.dirname(HERE))
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=43)
    parser.add_argument("--logical", type=int, default=12)
    parser.add_argument("--physical", type=int, default=16)
    parser.add_argument("--row-elems", type=int, default=256)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steady-steps", type=int, default=150)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    import tempfile

    runs = [
        ("stock 0.34.0", args.stock_tree, None),
        ("patched, staged=1", args.patched_tree, 1),
        (f"patched, staged={args.layers}", args.patched_tree, args.layers),
    ]
    report = {"config": vars(args), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, tree, staged) in enumerate(runs):
            print(f"running {name} ...", flush=True)
            raw = _launch(f"run{i}", tree, staged, args, tmp)
            ranks = []
            for rank, (status, value) in enumerate(raw["ranks"]):
                if status != "ok":
                    raise SystemExit(f"{name} rank {rank} failed: {value}")
                steady = _summary(value["steady"])
                migr = _summary(value["migration"])
                ranks.append(
                    {
                        "rank": rank,
                        "steady": steady,
                        "migration": migr,
                        "p99_ratio": migr["p99_ms"] / steady["p99_ms"],
                        "collectives_per_migration_step": value[
                            "collectives_per_migration_step"
                        ],
                        "steps_per_cycle": value["steps_per_cycle"],
                        "eplb_buffer_bytes": value["eplb_buffer_bytes"],
                        "max_step_alloc_bytes": value["max_step_alloc_bytes"],
                    }
                )
            print(f"  vllm loaded from {raw['vllm']}", flush=True)
            report["runs"].append({"name": name, "vllm": raw["vllm"], "ranks": ranks})
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    header = (
        f"{'run':<20}{'rk':>3}{'steady p50/p99/max ms':>24}"
        f"{'migration p50/p99/max ms':>27}{'p99 x':>7}{'coll/step':>10}"
        f"{'steps/cycle':>13}{'EPLB bytes':>12}{'step alloc B':>13}"
    )
    print(header)
    for run in report["runs"]:
        for r in run["ranks"]:
            s, m = r["steady"], r["migration"]
            print(
                f"{run['name']:<20}{r['rank']:>3}"
                f"{s['p50_ms']:>8.2f}/{s['p99_ms']:.2f}/{s['max_ms']:.2f}".ljust(47)
                + f"{m['p50_ms']:>8.2f}/{m['p99_ms']:.2f}/{m['max_ms']:.2f}".ljust(27)
                + f"{r['p99_ratio']:>7.2f}{r['collectives_per_migration_step']:>10.2f}"
                f"{str(r['steps_per_cycle']):>13}{r['eplb_buffer_bytes']:>12}"
                f"{r['max_step_alloc_bytes']:>13}"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
