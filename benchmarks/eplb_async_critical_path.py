# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Async EPLB on the decode critical path: stock vLLM vs this tree, one run.

Each implementation runs in its own process group (PYTHONPATH pointing at its
vLLM tree) of forked CPU gloo ranks. Every rank drives the real EplbState and
async worker in a decode loop whose "forward" holds the GIL for Python work
(input preparation and sampling bookkeeping as real Python loops) and runs
torch ops, with one collective per step as decode has. By default nothing
sleeps; --device-ms adds the GPU's share of a step, during which the host
waits with the GIL released, as it does in a CUDA sync. --cpu-group-latency-ms
models EP ranks on several nodes (vLLM #57883): every operation on the EP and
EPLB groups' gloo CPU groups (a collective, cpu_all_reduce_, a p2p batch), and
on the DP group's where there is one, first waits that long with the GIL
released, as a cross-node round trip does.

Stock and patched each run in two configurations (--configs):
  dp_sync  Model Runner V2's per-step DP batch sync, for real: vLLM's DP group
           is a gloo GroupCoordinator over the ranks (DP group = EP group, as
           in DEP) and each step calls the tree's own
           sync_cudagraph_and_dp_padding before the forward. The patched tree
           registers async EPLB's column on it (DPSyncRows, with
           EPLBController's provider class), so step() should issue no
           collective during a migration; stock's table keeps its 7 rows and
           step() polls as before.
  own      no DP sync: step() runs its own collective while a migration is in
           flight (patched: one small cpu_all_reduce_; stock: its poll).

Per rank it reports the decode step time (DP sync + forward +
EplbState.step() + the step's collective) in steady state and during
migrations, the collectives the main thread issues inside EplbState.step() per
migration step (and in the whole step), the steps per migration cycle, the
forwards per cycle that ran before the first one on the whole new placement
(stock applies in step(), after a step's forward; the DP-sync path applies
before it, so a layer that serves the same forward switches one step later
there), the DP sync's own time, and the bytes EPLB holds or allocates on the weights'
device. Each --cpu-group-latency-ms value writes its own results file, and a
final table puts stock and patched side by side.

Usage (trees: a stock vLLM 0.34.0 source tree and the applied series):
    python benchmarks/eplb_async_critical_path.py \
        --stock-tree ../stock-0.34.0 --patched-tree .vstack/repo \
        [--configs dp_sync,own] [--staged 1] [--cycles 3] \
        [--device-ms 20 --requests 512] [--cpu-group-latency-ms 0,0.5,2]
"""

import argparse
import contextlib
import json
import os
import shlex
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


_DEVICE_IDLE = threading.Event()  # never set: wait() is a GIL-free timed wait


def _forward(x, w, num_requests, device_s):
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
    if device_s:
        # The GPU running the step: the host blocks in the sync before
        # sampling with the GIL released (as torch.accelerator.synchronize()
        # and .item() do), and its core is free for other threads.
        _DEVICE_IDLE.wait(device_s)
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

        self.count = 0  # inside EplbState.step()
        self.active = False
        self.total = 0  # the whole decode step: DP sync, step(), decode's
        self.whole = False
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
            if threading.current_thread() is self.thread:
                self.count += self.active
                self.total += self.whole
            return fn(*args, **kwargs)

        return wrapper


def _add_cpu_group_latency(seconds):
    """Every operation on the EP/EPLB (and, with the DP sync, DP) gloo CPU
    groups waits ``seconds`` first, with the GIL released, in stock and
    patched trees alike. In a DEP deployment the DP group is the EP group."""
    import torch.distributed as dist
    import vllm.distributed.eplb.eplb_communicator as communicator
    import vllm.distributed.eplb.eplb_state as eplb_state
    import vllm.distributed.parallel_state as parallel_state
    import vllm.distributed.utils as dist_utils

    def cpu_groups():
        return {
            id(g.cpu_group)
            for g in (parallel_state._EP, parallel_state._EPLB, parallel_state._DP)
            if g is not None
        }

    def on_cpu_group(args, kwargs):
        group = kwargs.get("group")
        if group is None:
            group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
        if group is None and args and isinstance(args[0], list):  # P2POps
            group = next((op.group for op in args[0]), None)
        return group is not None and id(group) in cpu_groups()

    def delayed(fn, always=False):
        def wrapper(*args, **kwargs):
            if always or on_cpu_group(args, kwargs):
                _DEVICE_IDLE.wait(seconds)
            return fn(*args, **kwargs)

        return wrapper

    # cpu_all_reduce_ always runs on a CPU group; modules imported it by name.
    real_cpu_all_reduce = dist_utils.cpu_all_reduce_
    for module in (
        sys.modules.get("vllm.distributed.eplb.async_worker"),
        dist_utils,
        parallel_state,
    ):
        if module is not None and getattr(module, "cpu_all_reduce_", None) is (
            real_cpu_all_reduce
        ):
            module.cpu_all_reduce_ = delayed(real_cpu_all_reduce, always=True)
    dist.all_reduce = delayed(dist.all_reduce)
    eplb_state.all_reduce = delayed(eplb_state.all_reduce)
    communicator.batch_isend_irecv = delayed(communicator.batch_isend_irecv)


def _setup_dp_sync(rank, world_size, state):
    """Model Runner V2's per-step DP batch sync, for real: vLLM's DP group is
    a gloo ``GroupCoordinator`` over the ranks (DP group = EP group, as in a
    DEP deployment), and each step calls the tree's own
    ``sync_cudagraph_and_dp_padding``. Where the tree has the DPSyncRows hook,
    async EPLB's column is registered as ``EPLBController._maybe_ride_dp_sync``
    does, with the controller's own provider class. Returns the per-step call
    and the number of rows the synced table has."""
    from types import SimpleNamespace

    from vllm.config.compilation import CUDAGraphMode
    from vllm.distributed import parallel_state
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.dp_utils import sync_cudagraph_and_dp_padding

    # Collective over the world: every rank creates it at the same point.
    parallel_state._DP = parallel_state.init_model_parallel_group(
        [list(range(world_size))], rank, "gloo", group_name="dp"
    )
    rows = 7
    try:
        from vllm.v1.worker.dp_utils import register_dp_sync_rows
        from vllm.v1.worker.gpu.eplb_utils import _AsyncEplbSyncRows
    except ImportError:  # stock: no hook, the stock 7-row table
        provider = None
    else:
        controller = SimpleNamespace(
            state=state, parallel_config=state.parallel_config, suppressed=False
        )
        provider = _AsyncEplbSyncRows(controller)
        register_dp_sync_rows(provider)
        rows += provider.num_rows
    num_tokens = 64  # a uniform decode batch, eager (no CUDA graphs on CPU)
    desc = BatchExecutionDescriptor(
        cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_tokens
    )

    def dp_sync():
        _, sync = sync_cudagraph_and_dp_padding(
            None,
            desc,
            num_tokens,
            num_tokens,
            1,
            world_size,
            rank,
            max_query_len=1,
        )
        assert sync is not None and sync.eager

    return dp_sync, rows


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
    import vllm.distributed.eplb.async_worker  # noqa: F401

    if cfg["cpu_group_latency_ms"]:
        _add_cpu_group_latency(cfg["cpu_group_latency_ms"] / 1e3)
    state = make_eplb_state(model, use_async=True, **kwargs)
    dp_sync, dp_sync_rows = (
        _setup_dp_sync(rank, world_size, state) if cfg["dp_sync"] else (None, 0)
    )
    ms = model_state(state)
    eplb_bytes = sum(b.numel() * b.element_size() for b in ms.expert_buffer)
    for slot in getattr(ms, "staging_slots", [])[1:]:
        eplb_bytes += sum(b.numel() * b.element_size() for b in slot.buffers)
    state.start_async_loop()
    counter = _MainThreadCollectives()
    x = torch.randn(64, 128)
    w = torch.randn(128, 128) * 0.05
    steady, migration, collectives, cycles, alloc = [], [], [], [], 0
    whole_step_collectives = []  # per migration step, outside step() too
    dp_sync_s = []  # the DP batch sync alone, timed steps
    eplb_step = []  # EplbState.step() alone, during migrations
    apply_steps = []  # per cycle: steps at which some layer switched
    # Per cycle: forwards that ran before the first one on the whole new
    # placement. Where a step applies (stock: in step(), after the forward;
    # the DP-sync path: before the forward) moves the step a layer switches
    # on, not the forward it first serves, so this compares the two alike.
    old_forwards = []

    def decode_step(record, track_alloc=False, placements=None):
        t0 = time.perf_counter()
        untimed = 0.0
        counter.whole, counter.total = True, 0
        if dp_sync is not None:
            # Model Runner V2: execute_model's batch sync, before the forward.
            dp_sync()
            if record is not None:
                dp_sync_s.append(time.perf_counter() - t0)
        if placements is not None:
            t_copy = time.perf_counter()
            placements.append(ms.physical_to_logical_map.clone())
            untimed += time.perf_counter() - t_copy
        _forward(x, w, cfg["requests"], cfg["device_ms"] / 1e3)
        counter.active, counter.count = True, 0
        # The dispatch mode slows every op, so it runs only in the untimed
        # allocation cycle.
        mode = _AllocBytes() if track_alloc else contextlib.nullcontext()
        t_step = time.perf_counter()
        with mode:
            state.step()
        step_s = time.perf_counter() - t_step
        counter.active = False
        done = torch.tensor([int(ms.rebalanced)])
        dist.all_reduce(done)  # decode is collective: one per step
        elapsed = time.perf_counter() - t0 - untimed
        counter.whole = False
        if record is not None:
            record.append(elapsed)
        if record is migration:
            eplb_step.append(step_s)
        return int(done), (counter.count, counter.total), getattr(mode, "bytes", 0)

    for _ in range(cfg["warmup"]):
        decode_step(None)
    # Timed cycles, then one untimed cycle that counts allocations.
    for cycle in range(cfg["cycles"] + 1):
        track_alloc = cycle == cfg["cycles"]
        for _ in range(cfg["steady_steps"]):
            decode_step(steady)
        arm_trigger(state, seed=100 + cycle)
        placements = []
        # The trigger step: load all_reduce + rearrange().
        decode_step(None, placements=placements)
        steps, switched = 1, 0
        prev = ms.physical_to_logical_map.clone()
        while True:
            busy, (count, total), nbytes = decode_step(
                None if track_alloc else migration, track_alloc, placements
            )
            # Outside the timed step: did a layer switch on this step?
            if not torch.equal(prev, ms.physical_to_logical_map):
                switched += 1
                prev.copy_(ms.physical_to_logical_map)
            collectives.append(count)
            whole_step_collectives.append(total)
            alloc = max(alloc, nbytes)
            steps += 1
            if busy == 0 or steps > 2000:
                break
        if not track_alloc:
            cycles.append(steps)
            apply_steps.append(switched)
            new = ms.physical_to_logical_map
            old_forwards.append(sum(not torch.equal(p, new) for p in placements))
    return {
        "steady": steady,
        "migration": migration,
        "eplb_step": eplb_step,
        "collectives_per_migration_step": sum(collectives) / max(1, len(collectives)),
        "whole_step_collectives_per_migration_step": sum(whole_step_collectives)
        / max(1, len(whole_step_collectives)),
        "dp_sync_rows": dp_sync_rows,
        "dp_sync": dp_sync_s,
        "steps_per_cycle": cycles,
        "apply_steps_per_cycle": apply_steps,
        "forwards_before_new_placement_per_cycle": old_forwards,
        "eplb_buffer_bytes": eplb_bytes,
        "max_step_alloc_bytes": alloc,
    }


def _run_impl(name, cfg, out_path):
    sys.path.insert(0, os.path.join(cfg["patched_tree"], "tests/distributed/eplb"))
    import vllm
    from eplb_ranks import run_ranks

    # Without the tests' collective-contract checker: it adds a round trip to
    # every collective it checks.
    results = run_ranks(
        cfg["ranks"], _rank_scenario, timeout_s=600, contract=False, cfg=cfg
    )
    with open(out_path, "w") as f:
        json.dump({"impl": name, "vllm": vllm.__file__, "ranks": results}, f)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _omp_threads(ranks):
    return max(1, (os.cpu_count() or 1) // ranks)


def _launch(name, tree, staged_layers, dp_sync, latency_ms, args, tmp):
    cfg = {
        "ranks": args.ranks,
        "layers": args.layers,
        "logical": args.logical,
        "physical": args.physical,
        "row_elems": args.row_elems,
        "requests": args.requests,
        "device_ms": args.device_ms,
        "cpu_group_latency_ms": latency_ms,
        "dp_sync": dp_sync,
        "warmup": args.warmup,
        "steady_steps": args.steady_steps,
        "cycles": args.cycles,
        "staged_layers": staged_layers,
        "patched_tree": os.path.abspath(args.patched_tree),
    }
    out = os.path.join(tmp, f"{name}.json")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), VLLM_TARGET_DEVICE="cpu")
    # As vLLM's multiproc executor does for its workers: intra-op threads of
    # several ranks that oversubscribe the cores stall for tens of ms.
    env.setdefault("OMP_NUM_THREADS", str(_omp_threads(args.ranks)))
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


CONFIGS = {
    "dp_sync": "each step calls the tree's sync_cudagraph_and_dp_padding on a gloo "
    "DP group of the ranks before the forward; the patched tree's async EPLB "
    "column rides it (DPSyncRows, as EPLBController registers it), stock's "
    "table has its 7 rows",
    "own": "no DP sync: EplbState.step() runs its own collective while a "
    "migration is in flight (stock: its per-step poll; patched: one small "
    "cpu_all_reduce_)",
}


def _worst(run, key):
    return max(key(r) for r in run["ranks"])


def _mean_steps(r):
    return sum(r["steps_per_cycle"]) / len(r["steps_per_cycle"])


def _mean_old_forwards(r):
    old = r["forwards_before_new_placement_per_cycle"]
    return sum(old) / len(old)


def _stock_of(runs, run):
    return next(
        r
        for r in runs
        if r["impl"].startswith("stock") and r["config"] == run["config"]
    )


def _summary_rows(runs):
    """Per run, the worst rank's figures, patched runs also relative to stock
    in the same configuration."""
    rows = {}
    for run in runs:
        name = run["name"]
        stock = _stock_of(runs, run)
        p99 = _worst(run, lambda r: r["migration"]["p99_ms"])
        steps = _worst(run, _mean_steps)
        vs = "" if run is stock else " ({:.2f}x stock)"
        rows[f"{name}: migration p99 / steady p99"] = "{:.2f}".format(
            _worst(run, lambda r: r["p99_ratio"])
        )
        rows[f"{name}: migration step p99 ms"] = f"{p99:.1f}" + vs.format(
            p99 / _worst(stock, lambda r: r["migration"]["p99_ms"])
        )
        rows[f"{name}: steady step p99 ms"] = "{:.1f}".format(
            _worst(run, lambda r: r["steady"]["p99_ms"])
        )
        rows[f"{name}: EplbState.step() p50/p99 ms, migration"] = (
            "{:.2f}/{:.2f}".format(
                _worst(run, lambda r: r["eplb_step_in_migration"]["p50_ms"]),
                _worst(run, lambda r: r["eplb_step_in_migration"]["p99_ms"]),
            )
        )
        if run["config"] == "dp_sync":
            rows[f"{name}: DP sync p50/p99 ms"] = "{:.2f}/{:.2f}".format(
                _worst(run, lambda r: r["dp_sync_step"]["p50_ms"]),
                _worst(run, lambda r: r["dp_sync_step"]["p99_ms"]),
            )
            rows[f"{name}: DP sync table rows (x ranks, int32)"] = run["ranks"][0][
                "dp_sync_rows"
            ]
        rows[f"{name}: main-thread collectives per migration step, in step()"] = _worst(
            run, lambda r: r["collectives_per_migration_step"]
        )
        rows[f"{name}: main-thread collectives per migration step, whole step"] = (
            _worst(run, lambda r: r["whole_step_collectives_per_migration_step"])
        )
        rows[f"{name}: steps per cycle, mean"] = f"{steps:.1f}" + vs.format(
            steps / _worst(stock, _mean_steps)
        )
        old = _worst(run, _mean_old_forwards)
        rows[f"{name}: forwards before the new placement, mean"] = (
            f"{old:.1f}" + vs.format(old / _worst(stock, _mean_old_forwards))
        )
        rows[f"{name}: EPLB device bytes / bytes allocated per step"] = (
            f"{_worst(run, lambda r: r['eplb_buffer_bytes'])} / "
            f"{_worst(run, lambda r: r['max_step_alloc_bytes'])}"
        )
    return rows


def _checks(runs, goal):
    """Patched vs stock in the same configuration, worst rank of each."""
    checks = []
    for run in runs:
        if run["impl"].startswith("stock"):
            continue
        stock = _stock_of(runs, run)
        steps = _worst(run, _mean_steps)
        stock_steps = _worst(stock, _mean_steps)
        old = _worst(run, _mean_old_forwards)
        stock_old = _worst(stock, _mean_old_forwards)
        ratio = _worst(run, lambda r: r["p99_ratio"])
        stock_ratio = _worst(stock, lambda r: r["p99_ratio"])
        checks.append(
            {
                "run": run["name"],
                "steps_per_cycle": steps,
                "stock_steps_per_cycle": stock_steps,
                "steps_per_cycle_le_stock": steps <= stock_steps,
                "forwards_before_new_placement": old,
                "stock_forwards_before_new_placement": stock_old,
                "forwards_before_new_placement_le_stock": old <= stock_old,
                "p99_ratio": ratio,
                "stock_p99_ratio": stock_ratio,
                "p99_ratio_le_stock": ratio <= stock_ratio,
                f"p99_ratio_le_{goal:g}x": ratio <= goal,
                "collectives_in_step": _worst(
                    run, lambda r: r["collectives_per_migration_step"]
                ),
            }
        )
    return checks


def _print_table(report):
    def trio(summary, keys=("p50_ms", "p99_ms", "max_ms")):
        return "/".join(f"{summary[k]:.1f}" for k in keys)

    rows = [
        (
            "run",
            "rk",
            "steady p50/p99/max",
            "migration p50/p99/max",
            "p99 x",
            "step() p50/p99",
            "coll/step",
            "steps/cycle",
            "old fwds",
            "apply steps",
            "EPLB bytes",
            "step alloc B",
        )
    ]
    for run in report["runs"]:
        for r in run["ranks"]:
            rows.append(
                (
                    run["name"],
                    str(r["rank"]),
                    trio(r["steady"]),
                    trio(r["migration"]),
                    f"{r['p99_ratio']:.2f}",
                    trio(r["eplb_step_in_migration"], ("p50_ms", "p99_ms")),
                    f"{r['collectives_per_migration_step']:.2f}",
                    str(r["steps_per_cycle"]),
                    str(r["forwards_before_new_placement_per_cycle"]),
                    str(r["apply_steps_per_cycle"]),
                    str(r["eplb_buffer_bytes"]),
                    str(r["max_step_alloc_bytes"]),
                )
            )
    _print_rows(rows)
    print(
        "(times in ms; step() is EplbState.step() alone, during migrations; "
        "coll/step: main-thread collectives inside step() per migration step; "
        "old fwds: forwards per cycle before the first on the whole new "
        "placement)"
    )


def _print_rows(rows):
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(
                cell.ljust(w) for cell, w in zip(row, widths, strict=True)
            ).rstrip()
        )


def _print_side_by_side(reports):
    """One line per configuration and latency, stock next to patched (worst
    rank of each)."""
    rows = [
        (
            "latency",
            "config",
            "patched run",
            "steps/cycle stock|patched",
            "old fwds stock|patched",
            "mig p99 ms stock|patched",
            "p99 ratio stock|patched",
            "coll in step() stock|patched",
            "coll whole step stock|patched",
        )
    ]
    for report in reports:
        runs = report["runs"]
        for run in runs:
            if run["impl"].startswith("stock"):
                continue
            stock = _stock_of(runs, run)

            def pair(key, fmt, run=run, stock=stock):
                return f"{fmt.format(_worst(stock, key))} | " + fmt.format(
                    _worst(run, key)
                )

            rows.append(
                (
                    f"{report['config']['cpu_group_latency_ms']:g} ms",
                    run["config"],
                    run["name"],
                    pair(_mean_steps, "{:.1f}"),
                    pair(_mean_old_forwards, "{:.1f}"),
                    pair(lambda r: r["migration"]["p99_ms"], "{:.1f}"),
                    pair(lambda r: r["p99_ratio"], "{:.2f}"),
                    pair(lambda r: r["collectives_per_migration_step"], "{:.2f}"),
                    pair(
                        lambda r: r["whole_step_collectives_per_migration_step"],
                        "{:.2f}",
                    ),
                )
            )
    _print_rows(rows)
    print(
        "(worst rank of each run; p99 ratio = migration-step p99 / steady-step "
        "p99; coll = main-thread collectives per migration step)"
    )


def _default_out(device_ms, latency_ms):
    name = "eplb_async_critical_path"
    if device_ms:
        name += f"_device{device_ms:g}ms"
        if latency_ms:
            name += f"_latency{latency_ms:g}ms"
    elif latency_ms:
        name += f"_latency{latency_ms:g}ms"
    return os.path.join(HERE, "results", name + ".json")


def _run_latency(latency_ms, runs, args, tmp):
    report_runs = []
    for i, (impl, config, tree, staged_layers) in enumerate(runs):
        name = f"{impl}, {config}"
        if staged_layers is not None and len(set(args.staged_list)) > 1:
            name += f", staged={staged_layers}"
        print(f"[{latency_ms:g} ms] running {name} ...", flush=True)
        raw = _launch(
            f"lat{latency_ms:g}_run{i}",
            tree,
            staged_layers,
            config == "dp_sync",
            latency_ms,
            args,
            tmp,
        )
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
                    "whole_step_collectives_per_migration_step": value[
                        "whole_step_collectives_per_migration_step"
                    ],
                    "dp_sync_rows": value["dp_sync_rows"],
                    "dp_sync_step": _summary(value["dp_sync"]),
                    "steps_per_cycle": value["steps_per_cycle"],
                    "apply_steps_per_cycle": value["apply_steps_per_cycle"],
                    "forwards_before_new_placement_per_cycle": value[
                        "forwards_before_new_placement_per_cycle"
                    ],
                    "eplb_step_in_migration": _summary(value["eplb_step"]),
                    "eplb_buffer_bytes": value["eplb_buffer_bytes"],
                    "max_step_alloc_bytes": value["max_step_alloc_bytes"],
                }
            )
        print(f"  vllm loaded from {raw['vllm']}", flush=True)
        report_runs.append(
            {
                "name": name,
                "impl": impl,
                "config": config,
                "async_staged_layers": staged_layers,
                "vllm": raw["vllm"],
                "ranks": ranks,
            }
        )
    return report_runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stock-tree", required=True, help="a vLLM tree at stock 0.34.0"
    )
    parser.add_argument(
        "--patched-tree",
        default=os.path.join(os.path.dirname(HERE), ".vstack", "repo"),
        help="a vLLM tree with the series applied (default: `vstack apply`'s "
        ".vstack/repo)",
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=43)
    parser.add_argument("--logical", type=int, default=12)
    parser.add_argument("--physical", type=int, default=16)
    parser.add_argument("--row-elems", type=int, default=256)
    parser.add_argument(
        "--requests",
        type=int,
        default=64,
        help="requests whose bookkeeping the forward does in Python (GIL held)",
    )
    parser.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        help="GPU time per step: the host waits with the GIL released "
        "(default 0: a host-bound step, the worst case for the async worker)",
    )
    parser.add_argument(
        "--cpu-group-latency-ms",
        default="0",
        help="comma-separated; added before every operation on the EP/EPLB "
        "(and DP) gloo CPU groups: ranks on several nodes (default 0: one "
        "machine). Each value is its own stock-vs-patched run and results file",
    )
    parser.add_argument(
        "--configs",
        default="dp_sync,own",
        help="comma-separated, each run for stock and patched: "
        + "; ".join(f"{k}: {v}" for k, v in CONFIGS.items()),
    )
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steady-steps", type=int, default=150)
    parser.add_argument("--cycles", type=int, default=3)
    parser.add_argument(
        "--staged",
        default="1",
        help="comma-separated async_staged_layers values for the patched "
        "tree (default: 1, the default)",
    )
    parser.add_argument(
        "--goal",
        type=float,
        default=1.05,
        help="goal for the patched migration p99 / steady p99 (default 1.05)",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="results file, for a single latency (default: "
        "results/eplb_async_critical_path[_device<D>ms][_latency<L>ms].json)",
    )
    parser.add_argument(
        "--machine",
        default=None,
        help="where it ran, recorded in the results (default: the core count)",
    )
    args = parser.parse_args()
    for flag, tree in (
        ("--stock-tree", args.stock_tree),
        ("--patched-tree", args.patched_tree),
    ):
        if not os.path.isfile(
            os.path.join(tree, "vllm", "distributed", "eplb", "eplb_state.py")
        ):
            parser.error(
                f"{flag} {tree}: not a vLLM source tree (no vllm/distributed/eplb)"
            )
    latencies = [float(v) for v in args.cpu_group_latency_ms.split(",")]
    configs = args.configs.split(",")
    for config in configs:
        if config not in CONFIGS:
            parser.error(f"--configs: unknown {config!r} (know {list(CONFIGS)})")
    if args.out and len(latencies) > 1:
        parser.error("--out takes a single --cpu-group-latency-ms value")
    import tempfile

    args.staged_list = [int(v) for v in args.staged.split(",")]
    runs = []
    for config in configs:
        runs.append(("stock 0.34.0", config, args.stock_tree, None))
        runs += [("patched", config, args.patched_tree, n) for n in args.staged_list]
    # The two implementations alternate, so drift on a shared machine hits both.
    command = shlex.join(
        [os.path.basename(sys.executable), os.path.relpath(__file__), *sys.argv[1:]]
    )
    machine = {
        "cores": os.cpu_count(),
        "description": args.machine or f"{os.cpu_count()} CPU cores, no GPU",
        "note": "CPU gloo ranks, not measured on GPU",
    }
    reports = []
    with tempfile.TemporaryDirectory() as tmp:
        for latency_ms in latencies:
            config = dict(
                vars(args), cpus=os.cpu_count(), cpu_group_latency_ms=latency_ms
            )
            config.pop("staged_list")
            config["omp_num_threads"] = os.environ.get(
                "OMP_NUM_THREADS", _omp_threads(args.ranks)
            )
            config["out"] = args.out or os.path.relpath(
                _default_out(args.device_ms, latency_ms)
            )
            load_start = os.getloadavg()[0]
            report = {
                "what": "stock vLLM 0.34.0 vs the applied series (decisions on the "
                "main threads), each in both configurations, in one run: "
                + "; ".join(f"{c}: {CONFIGS[c]}" for c in configs),
                "config": config,
                "runs": _run_latency(latency_ms, runs, args, tmp),
            }
            report["summary"] = _summary_rows(report["runs"])
            report["checks"] = _checks(report["runs"], args.goal)
            report["command"] = command
            # Other work on a shared machine shows here, not in the numbers.
            report["machine"] = dict(
                machine,
                load_average_1m=f"{load_start:.1f} at start, "
                f"{os.getloadavg()[0]:.1f} at end",
            )
            report["timestamp"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            os.makedirs(os.path.dirname(os.path.abspath(config["out"])), exist_ok=True)
            with open(config["out"], "w") as f:
                json.dump(report, f, indent=2)
            _print_table(report)
            print(f"wrote {config['out']}", flush=True)
            reports.append(report)
    print()
    _print_side_by_side(reports)


if __name__ == "__main__":
    main()
