"""The fixed rule's first choice per covariance type on CUDA (what a fresh history runs first).

Measure: the per-iteration time (median of single EM iterations, default tunables, the variants
taking turns from the same parameters: ``asp_gmm.autotune.measure``) of every CUDA covariance variant
that could be a first choice, on a grid of shapes, diagonal and full::

    python benchmarks/rule_order.py --measure benchmarks/out/rule_order.json

Evaluate (no GPU needed): for each covariance type, every order of those variants is scored by the
mean log-ratio of its first allowed variant's time to the shape's best; the order is chosen by
leave-one-out over the (D, M) pairs (both N of a pair held out together) and the held-out regret is
reported, beside the rule of :data:`asp_gmm.selection.PREFERENCE`::

    python benchmarks/rule_order.py --evaluate benchmarks/out/rule_order.json

Declared ratios (the CUDA manifests' ``rule_ratio``: each variant's time over the rule's first
choice's, smallest and largest over the grid), for variants outside the first choices too::

    python benchmarks/rule_order.py --measure out.json --variants V1,V2,V6 --n 200000 --cvtypes diag
    python benchmarks/rule_order.py --ratios out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time

FIRSTS = ["V4", "V5", "V7", "V8", "V9"]  # (V1-V3: 10-200x slower at every measured shape)
GRID_N = [200_000, 1_000_000]
GRID_D = [4, 19, 36, 64, 128]
GRID_M = [8, 32, 128, 512]


def measure(path: str, budget: float, extra=(), grid_n=GRID_N, cvtypes=("diag", "full")) -> None:
    os.environ.setdefault("ASP_GMM_DB", f"sqlite:///{tempfile.mkdtemp()}/h.sqlite")
    os.environ["ASP_GMM_AUTOTUNE"] = "0"
    import asp_gmm
    from asp_gmm import autotune
    from asp_gmm.backends import get_backend
    from asp_gmm.problem import Problem

    be = get_backend("cuda")
    t0, rows = time.time(), []
    for cv in cvtypes:
        for D, M in itertools.product(GRID_D, GRID_M):
            if time.time() - t0 > budget:
                break
            asp_gmm.prepare(D, M, backend="cuda", cvtype=cv, N=max(GRID_N))
            for N in grid_n:
                p = Problem(N, D, M, cv, "float32")
                names = (FIRSTS + ["V3"]) if not extra else [rule_first(cv), *extra]
                cfgs = autotune.configs_for(be, p, variants=names)
                ms = autotune.measure(be, p, cfgs, repeats=3, max_seconds=0.3, min_repeats=2)
                t = {m.config.variant.name: m.seconds for m in ms if m.status == "ok" and m.seconds}
                rows.append({"cv": cv, "N": N, "D": D, "M": M, "t": t})
                print(
                    cv, N, D, M, {k: round(v * 1e3, 3) for k, v in sorted(t.items(), key=lambda kv: kv[1])}, flush=True
                )
            with open(path, "w") as f:
                json.dump(rows, f)


def rule_first(cv: str) -> str:
    """The rule's first choice for ``cv`` on CUDA (what ``rule_ratio`` is declared against)."""
    from asp_gmm.selection import PREFERENCE

    return (PREFERENCE.get(("cuda", cv)) or PREFERENCE["cuda"])[0]


def ratios(path: str) -> None:
    """Each measured variant's ratio to the rule's first choice: the smallest and largest over the
    grid (a manifest's ``rule_ratio`` entry), per covariance type."""
    rows = json.load(open(path))
    for cv in ("diag", "full"):
        first = rule_first(cv)
        rs = [r for r in rows if r["cv"] == cv and first in r["t"]]
        names = sorted({n for r in rs for n in r["t"]} - {first})
        for n in names:
            got = [r["t"][n] / r["t"][first] for r in rs if n in r["t"]]
            if got:
                print(f"{cv} {n}: {cv} = [{min(got):.2f}, {max(got):.2f}]  ({len(got)} shapes against {first})")


def _first(order, t):
    return next((n for n in order if n in t), None)


def _regret(order, rows):
    """Mean log(time of the first allowed variant in ``order`` / the best time) over ``rows``."""
    vals = []
    for r in rows:
        n = _first(order, r["t"])
        if n is not None:
            vals.append(math.log(r["t"][n] / min(r["t"].values())))
    return statistics.fmean(vals) if vals else 0.0


def evaluate(path: str) -> None:
    from asp_gmm.selection import PREFERENCE

    rows = json.load(open(path))
    for cv in ("diag", "full"):
        rs = [r for r in rows if r["cv"] == cv and r["t"]]
        if not rs:
            continue
        orders = list(itertools.permutations(FIRSTS))
        pairs = sorted({(r["D"], r["M"]) for r in rs})
        held = []
        for pair in pairs:
            train = [r for r in rs if (r["D"], r["M"]) != pair]
            test = [r for r in rs if (r["D"], r["M"]) == pair]
            best = min(orders, key=lambda o: _regret(o, train))
            held.append((_regret(best, test), best[:2]))
        chosen = min(orders, key=lambda o: _regret(o, rs))
        rule = PREFERENCE.get(("cuda", cv)) or PREFERENCE["cuda"]
        old = PREFERENCE["cuda"]
        wins = {n: sum(1 for r in rs if min(r["t"], key=r["t"].get) == n) for n in FIRSTS}
        print(f"{cv}: {len(rs)} shapes; fastest: " + ", ".join(f"{n} {k}" for n, k in wins.items() if k))
        for name, o in (("rule now", rule), ("V5 first (before)", old), ("best order on all", chosen)):
            firsts = sum(1 for r in rs if _first(o, r["t"]) == min(r["t"], key=r["t"].get))
            print(
                f"  {name:18s} {'>'.join(o[:3])}: first choice fastest at {firsts}/{len(rs)}, "
                f"mean {math.exp(_regret(o, rs)):.3f}x the best"
            )
        heldout = math.exp(statistics.fmean(h for h, _ in held))
        picks = sorted({">".join(b) for _, b in held})
        print(f"  leave-one-(D, M)-out: held-out mean {heldout:.3f}x the best; orders chosen: {', '.join(picks)}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--measure", metavar="JSON", help="time the variants on the grid (needs a GPU)")
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for --measure")
    ap.add_argument("--evaluate", metavar="JSON", help="score rule orders on measured times")
    ap.add_argument("--variants", default="", help="measure these (comma-separated) against the rule's first")
    ap.add_argument("--n", default=",".join(map(str, GRID_N)), help="the grid's N (comma-separated)")
    ap.add_argument("--cvtypes", default="diag,full")
    ap.add_argument("--ratios", metavar="JSON", help="print each variant's ratio range to the rule's first")
    a = ap.parse_args(argv)
    if a.measure:
        extra = [v for v in a.variants.split(",") if v]
        measure(a.measure, a.budget, extra, [int(n) for n in a.n.split(",")], a.cvtypes.split(","))
    if a.evaluate:
        evaluate(a.evaluate)
    if a.ratios:
        ratios(a.ratios)
    if not (a.measure or a.evaluate or a.ratios):
        ap.error("give --measure, --evaluate or --ratios")


if __name__ == "__main__":
    sys.exit(main())
