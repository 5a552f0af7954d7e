"""The history of one device folded into per-class aggregates (:class:`_Index`): medians per
configuration, failures, sampled timings, the predictor chosen by leave-one-out."""

from __future__ import annotations

import math

import numpy as np

from ..problem import Problem

# ---------------------------------------------------------------------------------- history
#: Classes consulted by the nearest-neighbour prediction (rule 3).
NEIGHBOURS = 4
#: Weight of log N in the prediction distance (D and M weigh 1).
N_WEIGHT = 0.5
#: Timings kept per (class, configuration) in memory for the median (the database keeps all).
_KEEP = 63
#: A class's cached ranking of its candidates is recomputed after this many new rows of the device
#: (medians drift slowly; a configuration measured for the first time or a failure recomputes it
#: at once).
RANK_ROWS = 64


def problem_class(problem: Problem) -> tuple:
    """The key timings are grouped by: (cvtype, dtype, D, M, N in half-octaves)."""
    return (problem.cvtype, problem.dtype, problem.D, problem.M, round(2 * math.log2(max(problem.N, 1))))


class _Agg:
    """Seconds per event per EM iteration of one configuration in one class."""

    __slots__ = ("values", "median", "n")

    def __init__(self):
        self.values, self.median, self.n = [], 0.0, 0

    def add(self, v: float):
        if len(self.values) < _KEEP:
            self.values.append(v)
        else:
            self.values[self.n % _KEEP] = v
        self.n += 1
        s = sorted(self.values)
        k = len(s)
        self.median = s[k // 2] if k % 2 else 0.5 * (s[k // 2 - 1] + s[k // 2])


class _Index:
    """Aggregates of one device's rows: ok timings per class (full-data and sampled apart),
    failures per scope, and the predictors fitted to them."""

    def __init__(self, view):
        self.view = view
        self.consumed = 0
        self.classes: dict = {}  # class key -> {VariantKey: _Agg}, timings on the whole data
        self.sampled: dict = {}  # class key -> {VariantKey: _Agg}, timings on a sample
        self.compile_failed: set = set()  # (VariantKey, cvtype, dtype)
        self.run_failed: set = set()  # (VariantKey, cvtype, dtype, D, M)
        self._coords: dict = {}  # (cvtype, dtype) -> (class keys, array of log-coordinates)
        self._predictor: dict = {}  # (cvtype, dtype) -> (name, CostModel or None, loo nn, loo model)
        self._vkeys: dict = {}  # (cvtype, dtype) -> every configuration measured on the whole data
        #: class key -> [seconds of sampled (exploring) iterations, seconds of whole-data iterations,
        #: sampled timings] as recorded (``asp-gmm history why`` shows the budget spent)
        self.spent: dict = {}
        self._spread: dict = {}  # (cvtype, dtype) -> (rows consumed, widest ratio in a class)
        self.searched: dict = {}  # (class key, measured configurations) -> search proposals
        self.options: dict = {}  # (class key, number measured, candidates) -> [(Config, VariantKey)]
        #: class key -> scores(class key), dropped when a row of the class comes in (the selection
        #: walks every class of a cvtype nearest first on each call: recomputed, that walk was
        #: most of a small batched call's planning)
        self._scores: dict = {}
        self._class_spread: dict = {}  # class key -> its slowest / fastest ratio (see spread)
        #: counts the changes that can reorder a ranking: a configuration measured for the first
        #: time in a class (whole data or sampled), a failure
        self.generation = 0
        #: (class key, candidates, generation, rows consumed // RANK_ROWS) -> the ranking of the
        #: candidates (HistorySelector._rank): a class whose untried candidates stay pruned would
        #: otherwise re-rank on every call (about 1 ms, most of a small batched call's planning)
        self.ranked: dict = {}

    def update(self):
        rows = self.view.rows
        if self.consumed == len(rows):
            return
        for r in rows[self.consumed :]:
            if r.status == "ok":
                if r.seconds is None or r.N <= 0:
                    continue
                of = getattr(r, "sampled_from", None)
                ck = (r.cvtype, r.dtype, r.D, r.M, round(2 * math.log2(max(of or r.N, 1))))
                self._scores.pop(ck, None)
                self._class_spread.pop((bool(of), ck), None)
                table = self.sampled if of else self.classes
                per = table.get(ck)
                if per is None:
                    per = table[ck] = {}
                    if not of:
                        self._coords.pop((r.cvtype, r.dtype), None)
                        self._predictor.pop((r.cvtype, r.dtype), None)
                agg = per.get(r.variant)
                if agg is None:
                    agg = per[r.variant] = _Agg()
                    self.generation += 1
                    if not of:
                        self._vkeys.pop((r.cvtype, r.dtype), None)
                agg.add(r.seconds / r.N)
                # seconds spent: on samples (exploring) and on the whole data, per class
                spent = self.spent.get(ck) or [0.0, 0.0, 0]
                if of:
                    spent[0] += r.seconds
                    spent[2] += 1
                else:
                    spent[1] += r.seconds * max(getattr(r, "repeats", 1) or 1, 1)
                self.spent[ck] = spent
            elif r.status == "compile-failed":
                self.compile_failed.add((r.variant, r.cvtype, r.dtype))
                self.generation += 1
            else:
                self.run_failed.add((r.variant, r.cvtype, r.dtype, r.D, r.M))
                self.generation += 1
        self.consumed = len(rows)

    def scores(self, ck) -> dict:
        """{VariantKey: seconds per event} in class ``ck``: the whole-data median where there is one,
        else the sampled median scaled by the class's calibration (median ratio whole/sampled of
        the configurations measured both ways; 1 when none is). Shared: read, never change it."""
        got = self._scores.get(ck)
        if got is not None:
            return got
        full = self.classes.get(ck, {})
        samp = self.sampled.get(ck, {})
        out = {vk: a.median for vk, a in full.items()}
        if samp:
            ratios = sorted(full[vk].median / a.median for vk, a in samp.items() if vk in full and a.median > 0)
            cal = ratios[len(ratios) // 2] if ratios else 1.0
            for vk, a in samp.items():
                if vk not in out:
                    out[vk] = a.median * cal
        self._scores[ck] = out
        return out

    def failed(self, vk, problem: Problem) -> bool:
        return (vk, problem.cvtype, problem.dtype) in self.compile_failed or (
            vk,
            problem.cvtype,
            problem.dtype,
            problem.D,
            problem.M,
        ) in self.run_failed

    def nearest(self, problem: Problem):
        """Measured classes of the problem's cvtype and dtype, nearest first: [(distance, key)]."""
        ct = (problem.cvtype, problem.dtype)
        got = self._coords.get(ct)
        if got is None:
            keys = [k for k in self.classes if k[:2] == ct]
            arr = np.array(
                [(N_WEIGHT * k[4] * math.log(2) / 2, math.log(k[2]), math.log(k[3])) for k in keys], dtype=float
            ).reshape(-1, 3)
            got = self._coords[ct] = (keys, arr)
        keys, arr = got
        if not keys:
            return []
        here = np.array([N_WEIGHT * math.log(max(problem.N, 1)), math.log(problem.D), math.log(problem.M)])
        d = np.sqrt(((arr - here) ** 2).sum(axis=1))
        return [(float(d[i]), keys[i]) for i in np.argsort(d, kind="stable")]

    def spread(self, cvtype: str, dtype: str) -> float:
        """The widest ratio slowest / fastest among the configurations measured in one class of
        this cvtype and dtype, on the whole data or on samples of it (1.0 when no class has two).
        The samples' count: in a fresh history they are all there is, and a fallback variant 70x
        the fastest on a sample left the next unmeasured ones predicted at the 4x floor, each
        overshooting a call's exploring allowance 2-10x. Each class's ratio is kept until a row
        of the class comes in (as its scores are), so a call after a recorded row recomputes one
        class, not every class."""
        got = self._spread.get((cvtype, dtype))
        if got is None or got[0] != self.consumed:
            widest = 1.0
            for sampled, table in ((False, self.classes), (True, self.sampled)):
                for k, per in table.items():
                    if k[:2] != (cvtype, dtype) or len(per) < 2:
                        continue
                    w = self._class_spread.get((sampled, k))
                    if w is None:
                        ts = [a.median for a in per.values() if a.median > 0]
                        w = self._class_spread[(sampled, k)] = max(ts) / min(ts) if len(ts) > 1 else 1.0
                    widest = max(widest, w)
            got = self._spread[(cvtype, dtype)] = (self.consumed, widest)
        return got[1]

    def measured_keys(self, cvtype: str, dtype: str) -> set:
        """Every configuration (VariantKey) with a whole-data timing of this cvtype and dtype."""
        got = self._vkeys.get((cvtype, dtype))
        if got is None:
            got = self._vkeys[(cvtype, dtype)] = {
                vk for k, per in self.classes.items() if k[:2] == (cvtype, dtype) for vk in per
            }
        return got

    def predictor(self, cvtype: str, dtype: str):
        """``(name, model, loo_nearest, loo_model)`` for unseen shapes of (cvtype, dtype): the cost
        model (:mod:`asp_gmm.selection.costmodel`) where its leave-one-out accuracy over the measured
        classes is at least the nearest-neighbour rule's, else ``"nearest"`` (model ``None``).
        Refitted only when a new class is measured."""
        got = self._predictor.get((cvtype, dtype))
        if got is None:
            from . import costmodel

            classes = {}
            for k in self.classes:
                if k[:2] == (cvtype, dtype):
                    classes[(k[4] * math.log(2) / 2, math.log(k[2]), math.log(k[3]))] = self.scores(k)
            if len(classes) < costmodel.MIN_POINTS + 1:
                got = ("nearest", None, 0.0, 0.0)
            else:
                nn, _ = costmodel.loo_nearest_accuracy(classes)
                md, _ = costmodel.loo_model_accuracy(classes)
                model = None
                if md >= nn:
                    points: dict = {}
                    for c, times in classes.items():
                        for vk, t in times.items():
                            points.setdefault(vk, []).append((*c, math.log(t)))
                    model = costmodel.CostModel(points)
                got = ("model" if model is not None else "nearest", model, nn, md)
            self._predictor[(cvtype, dtype)] = got
        return got
