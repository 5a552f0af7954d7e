"""How much the selected variant gains over always using V1 and over the best single fixed variant.

    python benchmarks/selection.py                      # CPU grid on the C backend (a few minutes)
    python benchmarks/selection.py --grid small         # seconds, for a smoke test
    python benchmarks/selection.py --backend cuda --grid gpu    # the GPU grid (the paper's sizes)
    python benchmarks/selection.py --regret 200000x16x16 --cvtype diag   # regret of 30 calls vs best pinned

For every problem of the grid (D x M x N, full covariance, float32), every variant's default
configuration runs ``--repeats`` single EM iterations, the variants taking turns from the same
initial parameters (``asp_gmm.autotune.measure``; a variant stops repeating after
``--max-seconds``, but runs at least twice). The samples are split in two halves:

* half A is recorded into a private history (a temporary SQLite file, never the user's), and the
  real :class:`asp_gmm.selection.HistorySelector` chooses from it:
  - **selected**: the history has the problem (what ``train`` does once a problem is measured);
  - **predicted**: leave-one-out: the history has every *other* problem of the grid, and the
    selector predicts from the nearest measured problems (autotuning off: rule 3);
* half B, measured independently, prices every choice, so that noise that made a variant win in A
  does not also make it look fast.

Gains are reported both as time saved, ``1 - t_choice / t_V1``, and as speed-up, ``t_V1 /
t_choice``, averaged over the grid (arithmetic mean of the per-problem values; the speed-up's
geometric mean is given too). The best single fixed variant is the one with the smallest geometric
mean of ``t_variant / t_fastest`` over the grid. The selection overhead per ``train`` call on a warm
history is measured at the end (``--overhead-only`` runs only that).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from asp_gmm import autotune  # noqa: E402
from asp_gmm.backends import get_backend  # noqa: E402
from asp_gmm.problem import Problem  # noqa: E402
from asp_gmm.runtime import default_runtime, set_default_selector  # noqa: E402
from asp_gmm.selection import HistorySelector, RuleSelector, problem_class  # noqa: E402
from asp_gmm.tuning_db import History  # noqa: E402
from asp_gmm.specializer import Specializer  # noqa: E402

GRIDS = {
    # the paper's D 2..36 and M 1..128; N up to 150 000 keeps the CPU run to minutes on 2 cores
    "cpu": dict(N=[10000, 50000, 150000], D=[2, 6, 12, 19, 36], M=[1, 4, 16, 64, 128]),
    # the paper's GPU sizes, up to N = 500 000
    "gpu": dict(N=[10000, 100000, 500000], D=[2, 6, 12, 19, 24, 36], M=[1, 4, 16, 32, 64, 128]),
    "small": dict(N=[2000, 8000], D=[2, 8], M=[1, 8]),
}


def fmt_pct(x):
    return f"{100 * x:+.1f}%"


def measure_grid(backend, problems, repeats, max_seconds, seed, log, tunables=False):
    data = {}
    t0 = time.time()
    for i, p in enumerate(problems):
        cfgs = autotune.configs_for(backend, p, tunables)
        ms = autotune.measure(backend, p, cfgs, repeats=repeats, seed=seed, max_seconds=max_seconds, min_repeats=2)
        data[p] = ms
        ok = [m for m in ms if m.status == "ok"]
        w = min(ok, key=lambda m: m.seconds) if ok else None
        log(
            f"[{i + 1:3d}/{len(problems)} {time.time() - t0:6.0f}s] N={p.N:7d} D={p.D:3d} M={p.M:4d}  "
            + "  ".join(f"{m.label}:{1e3 * m.seconds:.2f}" if m.status == "ok" else f"{m.label}:{m.status}" for m in ms)
            + (f"  -> {w.label}" if w else "")
        )
    return data


def halves(m):
    a, b = m.samples[0::2], m.samples[1::2]
    return statistics.median(a), statistics.median(b if b else a)


def history_from(backend, data, folder, name, exclude=None):
    h = History(f"sqlite:///{folder}/{name}.sqlite", batch_rows=100000, flush_interval=1e9)
    sel = HistorySelector(h)
    for p, ms in data.items():
        if exclude is not None and problem_class(p) == problem_class(exclude):
            continue
        for m in ms:
            if m.status == "ok":
                a, _ = halves(m)
                sel.record(backend, p, m.config, "ok", a, None, len(m.samples[0::2]))
            else:
                sel.record(backend, p, m.config, m.status)
    h.flush()
    return h, sel


def evaluate(backend, data, folder, log):
    os.environ["ASP_GMM_AUTOTUNE"] = "0"  # prediction, not exploration
    h, sel = history_from(backend, data, folder, "all")
    rows = []
    for k, (p, ms) in enumerate(data.items()):
        cands = autotune.configs_for(backend, p)
        tB = {m.label: halves(m)[1] for m in ms if m.status == "ok"}
        plan = sel.plan(backend, p, cands)
        hl, lsel = history_from(backend, data, folder, f"loo{k}", exclude=p)
        lplan = lsel.plan(backend, p, cands)
        hl.close()
        os.unlink(f"{folder}/loo{k}.sqlite")
        rows.append(
            dict(
                N=p.N,
                D=p.D,
                M=p.M,
                times=tB,
                selected=autotune.short_label(plan.primary),
                sel_reason=plan.reason,
                predicted=autotune.short_label(lplan.primary),
                pred_reason=lplan.reason,
                pred_why=lplan.why,
                oracle=min(tB, key=tB.get),
            )
        )
    h.close()
    return rows


def unseen(rows, tolerance=0.05):
    """Leave-one-out over the grid's shapes, on the half-B prices: the fraction of shapes whose
    predicted configuration is within ``tolerance`` of the best, for the selector as it runs
    (``predicted``: cost model or nearest neighbour, whichever its history's LOO prefers) and for
    each predictor alone (:mod:`asp_gmm.costmodel`)."""
    from asp_gmm.selection import costmodel

    classes = {(math.log(r["N"]), math.log(r["D"]), math.log(r["M"])): dict(r["times"]) for r in rows}
    nn, n = costmodel.loo_accuracy(classes, costmodel.nearest_predictor, tolerance)
    md, _ = costmodel.loo_accuracy(classes, costmodel.model_predictor, tolerance)
    sel = sum(
        r["times"].get(r["predicted"], math.inf) <= (1 + tolerance) * r["times"][r["oracle"]] for r in rows
    ) / len(rows)
    return dict(selector=sel, nearest=nn, model=md, shapes=n)


def oracle_gain(rows, fixed, tolerance=0.05):
    """Oracle gain (exhaustive best per shape over the best single fixed configuration, geometric
    mean of the speed-ups), the selection's gain over the same fixed configuration, the fraction
    of the oracle gain it reaches, and the shapes where it is within ``tolerance`` of the best."""
    g_or = math.exp(statistics.fmean(math.log(r["times"][fixed] / r["times"][r["oracle"]]) for r in rows))
    g_sel = math.exp(statistics.fmean(math.log(r["times"][fixed] / r["times"][r["selected"]]) for r in rows))
    within = sum(r["times"][r["selected"]] <= (1 + tolerance) * r["times"][r["oracle"]] for r in rows)
    return dict(
        oracle_gain=g_or - 1,
        selected_gain=g_sel - 1,
        fraction=(g_sel - 1) / (g_or - 1) if g_or > 1 else 1.0,
        within=within,
        shapes=len(rows),
    )


def summarise(rows, baseline="V1"):
    names = sorted({n for r in rows for n in r["times"]})
    full = [n for n in names if all(n in r["times"] for r in rows)]
    geo = {n: math.exp(statistics.fmean(math.log(r["times"][n] / r["times"][r["oracle"]]) for r in rows)) for n in full}
    fixed = min(geo, key=geo.get)
    out = {"best_fixed": fixed, "fixed_geomean_vs_oracle": geo}
    for who in ("selected", "predicted", "oracle"):
        for ref in (baseline, fixed):
            saved = [1 - r["times"][r[who]] / r["times"][ref] for r in rows if ref in r["times"]]
            speed = [r["times"][ref] / r["times"][r[who]] for r in rows if ref in r["times"]]
            i_max = int(np.argmax(speed))
            rr = [r for r in rows if ref in r["times"]][i_max]
            out[f"{who}_vs_{ref}"] = dict(
                mean_saved=statistics.fmean(saved),
                max_saved=max(saved),
                mean_speedup=statistics.fmean(speed),
                geomean_speedup=math.exp(statistics.fmean(map(math.log, speed))),
                max_speedup=max(speed),
                at=(rr["N"], rr["D"], rr["M"]),
            )
        out[f"{who}_hits_oracle"] = sum(r[who] == r["oracle"] for r in rows) / len(rows)
    return out


def report(rows, summ, baseline="V1"):
    fixed = summ["best_fixed"]
    lines = [
        f"best single fixed variant: {fixed} (geometric mean of t / t_fastest over the grid: "
        + ", ".join(f"{n} {v:.2f}" for n, v in sorted(summ["fixed_geomean_vs_oracle"].items()))
        + ")",
        "",
        f"{'choice':30} {'vs':5} {'mean saved':>10} {'max saved':>10} {'mean x':>7} {'geo x':>6} {'max x':>6}"
        f"  {'max at (N, D, M)':18} {'= fastest':>9}",
    ]
    for who, label in (
        ("selected", "selected (history has problem)"),
        ("predicted", "predicted (leave-one-out)"),
        ("oracle", "fastest in half B (bound)"),
    ):
        for ref in dict.fromkeys((baseline, fixed)):
            s = summ[f"{who}_vs_{ref}"]
            lines.append(
                f"{label:30} {ref:5} {fmt_pct(s['mean_saved']):>10} {fmt_pct(s['max_saved']):>10} "
                f"{s['mean_speedup']:7.2f} {s['geomean_speedup']:6.2f} {s['max_speedup']:6.2f}  "
                f"{str(s['at']):18} {100 * summ[f'{who}_hits_oracle']:8.0f}%"
            )
    return "\n".join(lines)


def per_problem_table(rows, baseline="V1"):
    names = sorted({n for r in rows for n in r["times"]})
    head = (
        f"{'N':>7} {'D':>3} {'M':>4} "
        + " ".join(f"{n:>9}" for n in names)
        + f" {'selected':>8} {'predicted':>9} {'saved vs ' + baseline:>13}"
    )
    out = [head]
    for r in rows:
        t = r["times"]
        saved = 1 - t[r["selected"]] / t[baseline] if baseline in t else float("nan")
        out.append(
            f"{r['N']:7d} {r['D']:3d} {r['M']:4d} "
            + " ".join(f"{1e3 * t[n]:9.2f}" if n in t else f"{'-':>9}" for n in names)
            + f" {r['selected']:>8} {r['predicted']:>9} {fmt_pct(saved):>13}"
        )
    out.append("(milliseconds per EM iteration, half B)")
    return "\n".join(out)


def _export(h, folder):
    h.export(f"{folder}/warm.json")
    return f"{folder}/warm.json"


def overhead(backend_name, calls, log):
    """Selection cost per train call on a warm history: plan, record, and whole small train calls."""
    from asp_gmm import GMM
    from asp_gmm import selection

    os.environ["ASP_GMM_AUTOTUNE"] = "1"
    folder = tempfile.mkdtemp(prefix="asp_gmm_overhead_")
    os.environ["ASP_GMM_DB"] = f"sqlite:///{folder}/h.sqlite"
    backend = get_backend(backend_name)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((200, 19)).astype(np.float32)
    g = GMM(4, 19, backend=backend_name)
    selection.plan.EXPLORE_COMPILE_WORK = 0  # this tiny problem must explore every variant to warm the history
    for _ in range(30):  # explore the variants, then search their tunables until converged
        g.train(X, max_em_iters=3)
        if g.last_train.reason == "history":
            break
    # in isolation, on a copy of that history (the train-call measurement below keeps its own)
    default_runtime().selector.flush()
    iso = History(f"sqlite:///{folder}/isolated.sqlite")
    iso.import_(_export(History(os.environ["ASP_GMM_DB"]), folder))
    sel = HistorySelector(iso)
    p = Problem(200, 19, 4)
    cands = g._specializer.candidates(p)
    assert sel.plan(backend, p, cands).reason == "history"
    n = 20000
    t = time.perf_counter()
    for _ in range(n):
        sel.plan(backend, p, cands)
    plan_us = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for _ in range(n):
        sel.record(backend, p, cands[0], "ok", 1e-4, 5e-5, 3)
    sel.flush()  # the writes are part of the cost
    record_us = (time.perf_counter() - t) / n * 1e6

    def run(selector, n):
        set_default_selector(selector)
        t = time.perf_counter()
        for _ in range(n):
            GMM(4, 19, backend=backend_name).train(X, max_em_iters=3)
        return (time.perf_counter() - t) / n * 1e6

    class Timed(HistorySelector):
        """The default selector, timing its own plan and record inside real train calls."""

        spent = 0.0

        def plan(self, *a, **k):
            t = time.perf_counter()
            try:
                return super().plan(*a, **k)
            finally:
                self.spent += time.perf_counter() - t

        def record(self, *a, **k):
            t = time.perf_counter()
            try:
                return super().record(*a, **k)
            finally:
                self.spent += time.perf_counter() - t

    # blocks of calls alternate between the fixed rule and the history, so that a change of load
    # on the machine falls on both; medians of the blocks are compared
    block = max(calls // 20, 10)
    rule, hist, timed = [], [], Timed()
    try:
        run(timed, block)  # warm-up, not counted
        timed.spent = 0.0
        for _ in range(max(calls // block, 1)):
            rule.append(run(RuleSelector(), block))
            hist.append(run(timed, block))
        t = time.perf_counter()
        timed.flush()
        timed.spent += time.perf_counter() - t
    finally:
        set_default_selector(None)
    rule_us, hist_us = statistics.median(rule), statistics.median(hist)
    inside_us = timed.spent / (block * len(hist)) * 1e6
    rows = History(os.environ["ASP_GMM_DB"]).count()
    res = dict(
        plan_us=plan_us,
        record_us=record_us,
        selection_us_per_train=inside_us,
        train_rule_us=rule_us,
        train_history_us=hist_us,
        calls=calls,
        rows_after=rows,
    )
    log(
        f"selection overhead per train call on a warm history (plan + record + their share of the batched "
        f"writes and refreshes, timed inside {block * len(hist)} real train calls): {inside_us:.1f} us"
    )
    log(
        f"in isolation: plan {plan_us:.1f} us, record {record_us:.1f} us (writes included); "
        f"{calls} train calls each way (N=200, D=19, M=4, 3 iterations; median of blocks of {block}): "
        f"{rule_us:.0f} us per call with the fixed rule, {hist_us:.0f} us with the history "
        f"({hist_us - rule_us:+.0f} us); {rows} rows stored"
    )
    return res


def _dump_class(log):
    """Every timing the default runtime's history holds, per configuration: the median seconds per
    event on the data and on samples (what the selection compared), with the counts."""
    from asp_gmm.runtime import default_runtime

    per: dict = {}
    for h in default_runtime().histories.values():
        for r in h.rows():
            if r.status != "ok" or not r.seconds:
                continue
            key = (r.variant.name, r.variant.tunables, "sample" if r.sampled_from else "data")
            per.setdefault(key, []).append(r.seconds / r.N)
    for (name, tun, where), v in sorted(per.items(), key=lambda kv: statistics.median(kv[1])):
        log(f"    {where:6s} {1e9 * statistics.median(v):9.2f} ns/event x{len(v)} {name}{tun}")


def _close_history():
    """Flush and close the default runtime's history of ``$ASP_GMM_DB`` before its temporary folder
    goes (the exit flush would otherwise warn that the folder is gone)."""
    from asp_gmm.runtime import default_runtime

    rt = default_runtime()
    for url, h in list(rt.histories.items()):
        h.close()
        del rt.histories[url]


def first_call(backend_name, N, D, M, iters, repeats, log, max_calls=12):
    """First call of a problem on a fresh history against the same call once the history is warm.

    Each repeat: a fresh private history; compile everything first (``asp_gmm.prepare``: the
    compile cache is not what is measured); time the first ``GMM(M, D).train(X, iters, iters)``
    (it explores), then call again until a call neither explores nor searches (at most
    ``max_calls``) and time one more call ("warm"). The best of ``repeats`` of each is reported
    (the machine is shared: the minimum is the least disturbed). Returns a dict.
    """
    import asp_gmm
    from asp_gmm import GMM

    rng = np.random.default_rng(0)
    centres = rng.standard_normal((M, D)) * 4
    X = (centres[rng.integers(0, M, N)] + rng.standard_normal((N, D))).astype(np.float32)
    firsts, warms, explored, calls_to_warm, chosen = [], [], [], [], []
    for r in range(repeats):
        with tempfile.TemporaryDirectory(prefix="asp_gmm_first_") as folder:
            os.environ["ASP_GMM_DB"] = f"sqlite:///{folder}/h.sqlite"
            os.environ["ASP_GMM_AUTOTUNE"] = "1"
            asp_gmm.prepare(D, M, backend=backend_name)

            def call():
                g = GMM(M, D, backend=backend_name, seed=1)
                t0 = time.perf_counter()
                g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
                return time.perf_counter() - t0, g.last_train

            t, res = call()
            firsts.append(t)
            explored.append(list(res.explored))
            n = 1
            while res.reason != "history" and n < max_calls:
                _, res = call()
                n += 1
            calls_to_warm.append(n)
            t, res = call()
            warms.append(t)
            chosen.append(res.variant)
            log(
                f"  repeat {r}: first {firsts[-1]:.2f} s (explored {', '.join(explored[-1]) or '-'}), "
                f"warm after {n} calls {t:.2f} s ({res.variant})"
            )
            _close_history()
    out = dict(
        N=N,
        D=D,
        M=M,
        iters=iters,
        first=min(firsts),
        warm=min(warms),
        firsts=firsts,
        warms=warms,
        explored=explored,
        calls_to_warm=calls_to_warm,
        chosen=chosen,
    )
    out["ratio"] = out["first"] / out["warm"]
    return out


def regret(backend_name, shapes, calls, repeats, log, iters=10, cvtype="full", dump=False, paired=True):
    """Cumulative cost of ``calls`` consecutive ``GMM.train(X, iters)`` calls on a fresh history
    against the best pinned variant (default tunables), per shape.

    Each repeat: a fresh private history, everything compiled first; the pinned variants are timed
    ``max(3, repeats)`` calls each (median, steady), then ``calls`` unpinned calls, each timed
    whole; with ``paired`` (default) each is followed by a call of the best pinned variant, and
    the ratios are to those: cumulative after 3, 10 and 30 calls (sum of the calls / sum of the
    pinned calls beside them) and steady (median of the last five / median of the last five
    pinned); ``*_vs_before`` keep the ratios to the pinned time measured before the calls. The medians over ``repeats``
    are reported, with the spread (max - min) / median of each as the noise: a difference under
    that spread is not resolved.
    """
    import asp_gmm
    from asp_gmm import GMM

    out = []
    for N, D, M in shapes:
        rng = np.random.default_rng(0)
        centres = rng.standard_normal((M, D)) * 4
        X = (centres[rng.integers(0, M, N)] + rng.standard_normal((N, D))).astype(np.float32)
        per = {"3": [], "10": [], "30": [], "steady": []}
        best_name = None
        for r in range(repeats):
            with tempfile.TemporaryDirectory(prefix="asp_gmm_regret_") as folder:
                os.environ["ASP_GMM_DB"] = f"sqlite:///{folder}/h.sqlite"
                os.environ["ASP_GMM_AUTOTUNE"] = "1"
                set_default_selector(None)
                asp_gmm.prepare(D, M, backend=backend_name, cvtype=cvtype)

                trail = []  # (seconds, what ran, what was explored, why) of every unpinned call

                def call(variant=None):
                    g = GMM(M, D, cvtype=cvtype, backend=backend_name, variant=variant, seed=1)
                    busy = default_runtime().compiles_running
                    t0 = time.perf_counter()
                    g.train(X, min_em_iters=iters, max_em_iters=iters, tol=0.0)
                    t = time.perf_counter() - t0
                    if variant is None:
                        lt, ex = g.last_train, g._specializer.last_exploration
                        spent = (
                            "" if not ex else f"explore {1e3 * ex['spent']:.1f}/{1e3 * (ex['allowance'] or 0):.1f} ms"
                        )
                        # where a call's time goes besides its account: compiles running beside it
                        # (at its start), and its iterations' own seconds
                        its = getattr(g._specializer, "last_iter_seconds", None) or []
                        spent += f"; compiles beside {busy}; in the specializer {1e3 * lt.seconds:.1f} ms"
                        if its:
                            spent += " ; iterations " + " ".join(f"{1e3 * x:.1f}" for x in its)
                        trail.append((round(t, 4), lt.variant, list(lt.explored), lt.reason, spent))
                    return t

                os.environ["ASP_GMM_AUTOTUNE"] = "0"
                sp = Specializer(backend_name)
                names = [c.variant.name for c in sp.candidates(Problem(N, D, M, cvtype, "float32"))]
                pinned = {n: statistics.median(call(n) for _ in range(3)) for n in names}
                os.environ["ASP_GMM_AUTOTUNE"] = "1"
                best_name = min(pinned, key=pinned.get)
                best = pinned[best_name]
                ts, tp = [], []
                for _ in range(calls):
                    ts.append(call())
                    if paired:
                        # the best pinned variant again, right after: a baseline timed beside the
                        # same background compiles and host state as the unpinned calls (timed
                        # only before them, it was 0-18 % faster than the same configuration
                        # unpinned after them)
                        os.environ["ASP_GMM_AUTOTUNE"] = "0"
                        tp.append(call(best_name))
                        os.environ["ASP_GMM_AUTOTUNE"] = "1"
                for k in (3, 10, 30):
                    if k <= calls:
                        per[str(k)].append(sum(ts[:k]) / (sum(tp[:k]) if paired else k * best))
                        per.setdefault(f"{k}_vs_before", []).append(sum(ts[:k]) / (k * best))
                per["steady"].append(statistics.median(ts[-5:]) / (statistics.median(tp[-5:]) if paired else best))
                per.setdefault("steady_vs_before", []).append(statistics.median(ts[-5:]) / best)
                per.setdefault("pinned", []).append({n: round(t, 4) for n, t in pinned.items()})
                per.setdefault("calls", []).append(trail)
                for k, (t, ran, explored, why, spent) in enumerate(trail):
                    log(
                        f"    call {k + 1}: {1e3 * t:.1f} ms {ran} ({why}; {spent or 'no sample'})"
                        + (" explored " + ", ".join(explored) if explored else "")
                        + (f"; pinned {best_name} beside it {1e3 * tp[k]:.1f} ms" if paired else "")
                    )
                if dump:
                    _dump_class(log)
                _close_history()
                log(
                    f"  ({N}, {D}, {M}) {cvtype} repeat {r}: best pinned {best_name} {1e3 * best:.1f} ms"
                    + (f" before, {1e3 * statistics.median(tp):.1f} ms beside the calls; " if paired else "; ")
                    + ", ".join(f"{k}: {v[-1]:.2f}x" for k, v in per.items() if v and k not in ("pinned", "calls"))
                )
        row = dict(N=N, D=D, M=M, cvtype=cvtype, best=best_name)
        row["pinned"], row["calls"] = per.pop("pinned", []), per.pop("calls", [])
        for k, v in per.items():
            if v:
                med = statistics.median(v)
                row[k] = med
                row[k + "_noise"] = (max(v) - min(v)) / med
        out.append(row)
    lines = [
        "| (N, D, M) cov | best pinned | after 3 | after 10 | after 30 | steady | steady vs pinned before "
        "| noise (range/median) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in out:
        cells = [f"{r[k]:.2f}x" if k in r else "-" for k in ("3", "10", "30", "steady", "steady_vs_before")]
        noise = max(r.get(k + "_noise", 0.0) for k in ("3", "10", "30", "steady"))
        lines.append(
            f"| ({r['N']}, {r['D']}, {r['M']}) {r['cvtype']} | {r['best']} | "
            + " | ".join(cells)
            + f" | {100 * noise:.0f} % |"
        )
    log("\n".join(lines))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="c")
    ap.add_argument("--grid", default=None, choices=sorted(GRIDS), help="cpu (default for c), gpu (default for cuda)")
    ap.add_argument("--N", default=None, help="override the grid's N (comma-separated)")
    ap.add_argument("--D", default=None)
    ap.add_argument("--M", default=None)
    ap.add_argument("--repeats", type=int, default=6, help="iterations per variant and problem (split in halves)")
    ap.add_argument("--max-seconds", type=float, default=0.5, help="time cap per variant and problem (>= 2 runs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--calls", type=int, default=2000, help="train calls in the overhead measurement")
    ap.add_argument("--overhead-only", action="store_true")
    ap.add_argument(
        "--defaults-only",
        action="store_true",
        help="measure each variant's default tunables only (the grid is then cheaper, but the "
        "oracle is over variants only)",
    )
    ap.add_argument(
        "--first-call",
        action="store_true",
        help="only the first call on a fresh history against a warm one (CPU: N=1.5M, D=19, M=16; "
        "cuda: N=50M, D=36, M=128), 10 iterations",
    )
    ap.add_argument("--first-repeats", type=int, default=3)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="GPU: first call at N=10M, 2 repeats, and 8 shapes with default tunables (about 4 minutes)",
    )
    ap.add_argument(
        "--regret",
        default=None,
        help="shapes NxDxM,... : cumulative cost of consecutive calls on a fresh history against the best pinned variant",
    )
    ap.add_argument("--regret-calls", type=int, default=30)
    ap.add_argument("--regret-repeats", type=int, default=3)
    ap.add_argument("--regret-dump", action="store_true", help="log the class's timings after each repeat")
    ap.add_argument(
        "--regret-unpaired",
        action="store_true",
        help="ratios to the pinned time measured before the calls only (no pinned call after each)",
    )
    ap.add_argument("--cvtype", default="full", choices=["full", "diag"])
    ap.add_argument("--out", default=None, help="JSON results (default benchmarks/out/selection_<backend>.json)")
    args = ap.parse_args(argv)

    def log(msg):
        print(msg, flush=True)

    if args.regret:
        shapes = [tuple(int(float(x)) for x in s.split("x")) for s in args.regret.split(",")]
        out = regret(
            args.backend,
            shapes,
            args.regret_calls,
            args.regret_repeats,
            log,
            cvtype=args.cvtype,
            dump=args.regret_dump,
            paired=not args.regret_unpaired,
        )
        path = Path(args.out or Path(__file__).parent / "out" / f"selection_regret_{args.backend}.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=1))
        return

    backend = get_backend(args.backend)
    result = {"backend": args.backend, "device_id": backend.device_id, "fingerprint": backend.fingerprint()}
    if args.first_call or args.quick:
        gpu = args.backend == "cuda"
        N = (
            int(float(args.N))
            if args.N and "," not in args.N
            else ((10_000_000 if args.quick else 50_000_000) if gpu else 1_500_000)
        )
        D, M = (36, 128) if gpu else (19, 16)
        log(f"first call against warm, {args.backend}, N={N}, D={D}, M={M}, 10 iterations")
        fc = first_call(args.backend, N, D, M, 10, 2 if args.quick else args.first_repeats, log)
        result["first_call"] = fc
        log(
            f"\n| backend | N | D | M | first (s) | warm (s) | first/warm | target |\n|---|---|---|---|---|---|---|---|\n"
            f"| {args.backend} | {N} | {D} | {M} | {fc['first']:.2f} | {fc['warm']:.2f} | {fc['ratio']:.2f} | <= 1.2 |"
        )
        if args.first_call:
            out = Path(args.out or Path(__file__).parent / "out" / f"selection_first_{args.backend}.json")
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1, default=str))
            return
        args.grid = args.grid or "gpu"
        # 8 shapes, default tunables only (V5 alone has 96 combinations, each an nvcc compile per shape)
        args.N, args.D, args.M = "100000,500000", args.D or "24,36", args.M or "32,128"
        args.defaults_only, args.calls = True, min(args.calls, 300)
    if not args.overhead_only:
        g = dict(GRIDS[args.grid or ("gpu" if args.backend == "cuda" else "cpu")])
        for k in ("N", "D", "M"):
            if getattr(args, k):
                g[k] = autotune.parse_grid(getattr(args, k))
        problems = autotune.grid(g["N"], g["D"], g["M"])
        log(
            f"{args.backend} {backend.fingerprint().get('model', '')}: {len(problems)} problems, "
            f"N {g['N']}, D {g['D']}, M {g['M']}, full, float32"
        )
        t0 = time.time()
        data = measure_grid(backend, problems, args.repeats, args.max_seconds, args.seed, log, not args.defaults_only)
        with tempfile.TemporaryDirectory(prefix="asp_gmm_bench_") as folder:
            rows = evaluate(backend, data, folder, log)
        summ = summarise(rows)
        log("")
        log(per_problem_table(rows))
        log("")
        log(report(rows, summ))
        og, un = oracle_gain(rows, summ["best_fixed"]), unseen(rows)
        summ.update(oracle=og, unseen=un)
        log(
            f"\n| grid | shapes | best fixed | oracle gain | selected gain | fraction | within 5 % | "
            f"LOO selector | LOO nearest | LOO model |\n|---|---|---|---|---|---|---|---|---|---|\n"
            f"| {args.backend} | {og['shapes']} | {summ['best_fixed']} | {fmt_pct(og['oracle_gain'])} | "
            f"{fmt_pct(og['selected_gain'])} | {100 * og['fraction']:.0f} % | {og['within']}/{og['shapes']} | "
            f"{100 * un['selector']:.0f} % | {100 * un['nearest']:.0f} % | {100 * un['model']:.0f} % |"
        )
        log(f"\nmeasured in {time.time() - t0:.0f} s")
        result.update(grid=g, rows=rows, summary=summ)
    result["overhead"] = overhead(args.backend, args.calls, log)
    out = Path(args.out or Path(__file__).parent / "out" / f"selection_{args.backend}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str))
    log(f"results: {out}")


if __name__ == "__main__":
    main()
