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
#: The leave-one-out accuracies that choose the predictor (the most of a process's first plan:
#: 0.17 s for a history of ~300 classes) are reused, saved or memoised, while the classes of
#: their (cvtype, dtype) number within this fraction of those they were computed over: a few new
#: classes barely move a fraction over hundreds, and a history growing by a class or two per
#: process otherwise recomputed them in every process until its aggregates were saved again.
LOO_REUSE = 0.05


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
        #: (cvtype, dtype) -> (classes, leave-one-out accuracy of the nearest rule, of the cost
        #: model): kept while no class of the pair is added (and saved with the aggregates)
        self._loo: dict = {}

    # ------------------------------------------------------------------ saved aggregates
    def state(self) -> dict:
        """The aggregates as JSON-ready data (asp_gmm/selection/snapshot.py saves them): what
        :meth:`from_state` rebuilds without the rows."""
        keys: dict = {}

        def vk_i(vk):
            i = keys.get(vk)
            if i is None:
                i = keys[vk] = len(keys)
            return i

        def table(t):
            return [
                [list(ck), [[vk_i(vk), a.values[:], a.n, a.median] for vk, a in per.items()]] for ck, per in t.items()
            ]

        out = {
            "classes": table(self.classes),
            "sampled": table(self.sampled),
            "compile_failed": [[vk_i(vk), cv, dt] for vk, cv, dt in sorted(self.compile_failed, key=repr)],
            "run_failed": [[vk_i(vk), cv, dt, D, M] for vk, cv, dt, D, M in sorted(self.run_failed, key=repr)],
            "spent": [[list(ck), *v] for ck, v in self.spent.items()],
            "loo": [[*ct, *v] for ct, v in self._loo.items()],
        }
        out["variants"] = [[vk.backend, vk.name, vk.tunables, vk.source_sha256] for vk in keys]
        return out

    @classmethod
    def from_state(cls, view, state: dict, variant_key) -> "_Index":
        """An index holding the aggregates ``state`` (of :meth:`state`) and then ``view``'s rows
        (those stored after the state's, see :attr:`tuning_db.DeviceView.start_id`).
        ``variant_key(backend, name, tunables, sha)`` makes the history's keys."""
        idx = cls(view)
        vks = [variant_key(*v) for v in state["variants"]]

        def table(rows):
            out = {}
            for ck, per in rows:
                d = out[tuple(ck)] = {}
                for i, values, n, median in per:
                    a = _Agg()
                    a.values, a.n, a.median = [float(v) for v in values], int(n), float(median)
                    d[vks[i]] = a
            return out

        idx.classes = table(state["classes"])
        idx.sampled = table(state["sampled"])
        idx.compile_failed = {(vks[i], cv, dt) for i, cv, dt in state["compile_failed"]}
        idx.run_failed = {(vks[i], cv, dt, int(D), int(M)) for i, cv, dt, D, M in state["run_failed"]}
        idx.spent = {tuple(ck): [float(a), float(b), int(c)] for ck, a, b, c in state["spent"]}
        idx._loo = {(cv, dt): (int(n), float(nn), float(md)) for cv, dt, n, nn, md in state["loo"]}
        idx.generation = 1
        return idx

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

    def banked(self, ck, fraction: float) -> float:
        """The allowance earlier calls of class ``ck`` left unspent at ``fraction`` (:attr:`Plan.banked`)."""
        spent = self.spent.get(ck)
        return 0.0 if not spent else max(fraction * spent[1] - spent[0], 0.0)

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
        Refitted only when a new class is measured; the leave-one-out reused within :data:`LOO_REUSE`."""
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
                loo = self._loo.get((cvtype, dtype))
                if loo is not None and abs(loo[0] - len(classes)) <= LOO_REUSE * len(classes):
                    nn, md = loo[1], loo[2]  # the leave-one-out is most of a first plan's time
                else:
                    nn, _ = costmodel.loo_nearest_accuracy(classes)
                    md, _ = costmodel.loo_model_accuracy(classes)
                    self._loo[(cvtype, dtype)] = (len(classes), nn, md)
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
