"""Selection from the measured history of the device (:class:`HistorySelector`); see
:mod:`asp_gmm.selection` for the rules."""

from __future__ import annotations

import dataclasses
import math
import threading

from ..variant import Config
from .index import NEIGHBOURS, RANK_ROWS, _Index, problem_class
from . import plan as _plan
from .confirm import checks
from .plan import TUNE_VARIANTS, TUNE_WITHIN, Plan, RuleSelector, Selector, autotune_enabled, log, rule_order, why_best


class HistorySelector(Selector):
    """Selection from the measured history of the device (see the module documentation).

    Parameters
    ----------
    history : asp_gmm.tuning_db.History, optional
        The store to read and record into; by default the one at ``$ASP_GMM_DB`` (or the user data
        folder), opened on first use and re-opened when ``ASP_GMM_DB`` changes. When it cannot be
        opened, one warning says why and the fixed rule (:class:`RuleSelector`) decides instead.
    runtime : asp_gmm.runtime.Runtime, optional
        Whose shared histories to use without ``history``. A selector made with neither is bound to
        the runtime of the first specializer (policy) it is given to (:meth:`bind`); until then it
        decides by the fixed rule.
    strategy : str, optional
        The search strategy over tunables (:mod:`asp_gmm.selection.search`; default ``"coordinate"``).
    """

    def __init__(self, history=None, runtime=None, strategy: str | None = None):
        from . import search

        self.strategy = search.get(strategy)  # searches the tunables (asp_gmm.selection.search)
        self._fixed = history
        self._runtime = runtime  # whose shared history to use (bound by the policy when None)
        self._rule = RuleSelector()
        self._lock = threading.RLock()
        self._indexes: dict = {}  # (id(history), device_id) -> _Index
        self._devices: dict = {}  # id(backend) -> (backend, device_id, fingerprint)
        self._vkeys: dict = {}  # Config -> VariantKey

    # ------------------------------------------------------------------ plumbing
    def history(self):
        """The :class:`~asp_gmm.tuning_db.History` in use, or ``None`` when it cannot be opened."""
        if self._fixed is not None:
            return self._fixed
        return None if self._runtime is None else self._runtime.shared_history()

    @property
    def runtime(self):
        """The :class:`asp_gmm.runtime.Runtime` whose shared history this selector uses (or None)."""
        return self._runtime

    def bind(self, runtime) -> None:
        """Use ``runtime``'s shared history, unless given a history or a runtime already."""
        if self._runtime is None:
            self._runtime = runtime

    def _disable(self, history, exc) -> None:
        """Stop using a history that failed mid-run (its runtime warns once)."""
        if self._runtime is not None:
            self._runtime.disable(history, exc)
        elif getattr(history, "_asp_gmm_warned", False) is False:
            history._asp_gmm_warned = True
            log.warning("asp_gmm: the tuning history failed (%s); continuing without it", exc)

    def _device(self, backend):
        d = self._devices.get(id(backend))
        if d is None or d[0] is not backend:
            fp = backend.fingerprint()
            d = self._devices[id(backend)] = (backend, backend.device_id, fp)
        return d[1], d[2]

    def vkey(self, config: Config):
        """The history key of ``config`` (memoised by variant identity: hashing a Config is slow)."""
        v = config.variant
        k = (id(v), config.tunables)
        got = self._vkeys.get(k)
        if got is None or got[0] is not v:
            from ..tuning_db import VariantKey

            got = self._vkeys[k] = (v, VariantKey.of(v.backend, v.name, dict(config.tunables), v.source_sha256))
        return got[1]

    def index(self, backend, history=None):
        """The up-to-date aggregates of ``backend``'s device (for tools and tests)."""
        history = history or self.history()
        device_id, _ = self._device(backend)
        key = (id(history), device_id)
        with self._lock:
            idx = self._indexes.get(key)
            if idx is None:
                idx = self._indexes[key] = self._open_index(history, device_id)
                return idx
            view = history.view(device_id)
            if idx.view is not view:
                idx = self._indexes[key] = _Index(view)
            idx.update()
        return idx

    def _open_index(self, history, device_id):
        """The device's aggregates: saved ones (asp_gmm/selection/snapshot.py) and the rows stored
        since, or every stored row; noted to be saved when folded from many rows."""
        from . import snapshot
        from ..tuning_db import VariantKey

        saved = snapshot.load(history, device_id)
        idx = None
        if saved is not None:
            state, max_id = saved
            try:
                idx = _Index.from_state(None, state, VariantKey)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                log.debug("asp_gmm: the saved selection aggregates are unreadable (%s)", exc)
            view = history.view(device_id, start_id=max_id if idx is not None else 0)
            if idx is not None and view.start_id != max_id:
                idx = None  # the view was made before, from other rows
        if idx is None:
            view = history.view(device_id)
            if view.start_id:  # newer rows only, and not the aggregates they follow: read them all
                history.drop_view(device_id)
                view = history.view(device_id)
            idx = _Index(view)
        idx.view = view
        idx.update()
        if not view.start_id or len(view.rows) >= snapshot.RESAVE_ROWS:
            snapshot.capture(idx, history, device_id)
        return idx

    def warm(self, backend, problems) -> None:
        """The device's rows read and folded into the index, and the predictor of every (cvtype,
        dtype) of ``problems`` fitted: the first plan's one-time work (0.1-0.3 s for a history of
        ~8 000 rows), done where ``prepare`` runs, e.g. on a thread beside the caller's own setup."""
        history = self.history()
        if history is None:
            return
        try:
            idx = self.index(backend, history)
            with self._lock:
                for ct in sorted({(p.cvtype, p.dtype) for p in problems}):
                    idx.predictor(*ct)
        except Exception as exc:  # noqa: BLE001 - a broken history must not break prepare()
            self._disable(history, exc)

    # ------------------------------------------------------------------ policy
    def state_token(self, backend, problem, local=False):
        """The history and its index's generation (a configuration measured for the first time in
        any class, a failure; medians drift slowly: a settled plan is made again every few calls);
        ``local``: the class's own measured configurations and the failures instead."""
        history = self.history()
        if history is None:
            return "rule"
        try:
            idx = self.index(backend, history)
        except Exception:  # noqa: BLE001 - plan() reports a broken history; here: plan every call
            return None
        if not local:
            return (id(history), id(idx), idx.generation)
        ck = problem_class(problem)
        mine = (len(idx.classes.get(ck, ())), len(idx.sampled.get(ck, ())))
        return (id(history), id(idx), mine, len(idx.compile_failed), len(idx.run_failed))

    def plan(self, backend, problem, candidates, pinned=False) -> Plan:
        if pinned or len(candidates) <= 1:
            return self._rule.plan(backend, problem, candidates, pinned)
        history = self.history()
        if history is None:
            return self._rule.plan(backend, problem, candidates, pinned)
        try:
            history.maybe_flush()
            idx = self.index(backend, history)
        except Exception as exc:  # noqa: BLE001 - a broken history must not break train()
            self._disable(history, exc)
            return self._rule.plan(backend, problem, candidates, pinned)
        with self._lock:  # another thread's record() may be folding rows into the index
            return self._decide(backend, problem, candidates, idx)

    def _decide(self, backend, problem, candidates, idx) -> Plan:
        valid = [c for c in candidates if not idx.failed(self.vkey(c), problem)]
        if not valid:
            log.debug("every candidate failed before on this device; trying the rule's choice again")
            return self._rule.plan(backend, problem, candidates)
        scores = idx.scores(problem_class(problem))
        options = self._options(backend, problem, valid, scores, idx)
        untried = [c for c in valid if self.vkey(c) not in scores]
        best = min(options, key=lambda o: o[1]) if options else None
        if not autotune_enabled():
            if not untried:
                return Plan(best[0], [], "history", why=why_best(best, options))
            ranking, predicted, _, how = self._rank(backend, problem, valid, idx)
            log.debug(
                "%s %s for %s on %s (%s)",
                "predicted" if predicted else "rule",
                ranking[0].label,
                problem,
                backend.name,
                how,
            )
            return Plan(ranking[0], [], "predicted" if predicted else "rule", why=how)
        pruned, explore, why, ratios = [], [], "", {}
        if untried:
            rkey = (
                problem_class(problem),
                tuple(self.vkey(c) for c in valid),
                idx.generation,
                idx.consumed // RANK_ROWS,
            )
            got = idx.ranked.get(rkey)
            if got is None:
                if len(idx.ranked) > 4096:
                    idx.ranked.clear()
                got = idx.ranked[rkey] = self._rank(backend, problem, valid, idx)
            ranking, _, rel, how = got
            for c in ranking:
                if c not in untried:
                    continue
                r = rel.get(c)
                # evidence is counted per cvtype and dtype (the predictor is fitted per pair)
                if r is not None and r[1] >= _plan.PRUNE_MIN_CLASSES and r[0] > math.log(_plan.PRUNE_FACTOR):
                    pruned.append(c)
                else:
                    explore.append(c)
                    if r is not None:
                        ratios[c] = math.exp(r[0])
            predicted_slow = list(pruned)
            tail = self._rule_tail(backend, problem, valid, scores, best, explore)
            if tail:
                pruned += tail
                explore = [c for c in explore if c not in tail]
            primary = best[0] if best else next((c for c in ranking if c not in pruned), ranking[0])
            why = how + "".join(
                f"; {what} {', '.join(c.label for c in cs)} ({note})"
                for what, cs, note in (
                    ("pruned", predicted_slow, f"predicted > {_plan.PRUNE_FACTOR:g}x the best"),
                    ("not explored:", tail, f"the rule's tail, behind one >= {_plan.RULE_TAIL_FACTOR:g}x the best"),
                )
                if cs
            )
        else:
            primary = best[0]
        frac = _plan.EXPLORE_FRACTION
        if not explore:
            skey = (problem_class(problem), frozenset(self.vkey(c) for c, _ in options), len(valid))
            got = idx.searched.get(skey)
            if got is None:
                if len(idx.searched) > 4096:
                    idx.searched.clear()
                got = idx.searched[skey] = self._search(backend, problem, valid, options, idx)
            explore, ratios = list(got[0]), dict(got[1])
            if explore:
                frac = _plan.TUNE_FRACTION
                why = f"{self.strategy.name} search of the tunables of " + ", ".join(
                    sorted({c.variant.name for c in explore})
                )
        explore = [c for c in explore if c != primary] if untried else explore
        confirm, confirm_times = False, {}
        early = getattr(backend, "samples_underfill", False)
        if best is not None and (early or (not explore and not untried)):
            # the search has converged (where samples under-fill the device, at once: a variant
            # close to the best on the sample may win on the data): variants timed only on samples
            # run on the whole data
            checked, conf, ratios_c, times = checks(self.vkey, backend, problem, options, best, idx)
            if conf:
                confirm, primary, explore, ratios, confirm_times = True, checked, conf, ratios_c, times
                frac = _plan.EXPLORE_FRACTION  # variants, checked on the data
                why = "on the whole data next (timed on samples only): " + ", ".join(c.label for c in explore)
        if not explore:
            return Plan(primary, [], "history", pruned, why_best(best, options) + ("; " + why if why else ""))
        samp = idx.sampled.get(problem_class(problem), {})
        done = self.vkey(primary) in samp
        unknown = max(_plan.UNKNOWN_RATIO, idx.spread(problem.cvtype, problem.dtype))
        return Plan(
            primary,
            explore,
            "explore",
            pruned,
            why,
            done,
            predicted={c: r for c, r in ratios.items() if c in explore},
            unknown_ratio=unknown,
            fastest=best[1] if best else None,
            sampled_fastest=min((a.median for a in samp.values()), default=None),
            banked=idx.banked(problem_class(problem), frac),
            fraction=frac,
            confirm=confirm,
            confirm_times=confirm_times if confirm else {},
        )

    def confirm(self, backend, problem, candidates, plan):
        """``plan`` turned into a whole-data check (:attr:`Plan.confirm`) when variants timed only
        on samples of the class are within :data:`CONFIRM_WITHIN` of the fastest there, else None:
        asked after a call's sampled exploration, so that the call itself runs them in place
        rather than its whole EM on a sample's winner."""
        history = self.history()
        if history is None or plan.primary is None:
            return None
        try:
            idx = self.index(backend, history)
        except Exception:  # noqa: BLE001 - the plan stands
            return None
        with self._lock:
            valid = [c for c in candidates if not idx.failed(self.vkey(c), problem)]
            scores = idx.scores(problem_class(problem))
            options = self._options(backend, problem, valid, scores, idx)
            best = next(((c, t) for c, t in options if c == plan.primary), None)
            if best is None:
                return None
            primary, conf, ratios, times = checks(self.vkey, backend, problem, options, best, idx)
        if not conf:
            return None
        why = "on the whole data in this call (timed on samples only): " + ", ".join(c.label for c in conf)
        kw = dict(predicted=ratios, confirm=True, confirm_times=times, fraction=_plan.EXPLORE_FRACTION)
        return dataclasses.replace(plan, primary=primary, explore=conf, why=why, **kw)

    def _rule_tail(self, backend, problem, valid, scores, best, explore) -> list:
        """Untried variants of the backend's :attr:`~asp_gmm.backends.base.Backend.rule_tail` that
        the fixed rule puts after a variant measured in the class at :data:`RULE_TAIL_FACTOR` times
        the class's best or more: the rule orders by expected speed, so they are left unexplored
        (still fallbacks). On a fresh history nothing else predicts them: at (500 000, 36, 128)
        full on an H200, V3, V2 and V1 (5.9-8.2x V8's call) took the allowance of three calls
        after V4 had run 4x."""
        names = set(getattr(backend, "rule_tail", ()))
        if not names or best is None:
            return []
        order = rule_order(backend, valid, problem.kernel_cvtype)
        for i, c in enumerate(order):
            t = scores.get(self.vkey(c))
            if t is not None and t >= _plan.RULE_TAIL_FACTOR * best[1]:
                return [o for o in order[i + 1 :] if o.variant.name in names and o in explore]
        return []

    def _options(self, backend, problem, valid, measured, idx) -> list:
        """[(config, seconds per event)] measured in this class: the candidates, and tuned
        configurations of the same variants (same source hash) that the limits allow. Which
        configurations qualify is remembered per (class, configurations measured, candidates):
        only their times change from call to call."""
        vks = [self.vkey(c) for c in valid]
        ckey = (problem_class(problem), len(measured), tuple(vks))
        got = idx.options.get(ckey)
        if got is None:
            got, by_source = [], {}
            for c, vk in zip(valid, vks):
                by_source[(vk.backend, vk.name, vk.source_sha256)] = (c.variant, vk.tunables)
                if vk in measured:
                    got.append((c, vk))
            if len(measured) > len(got):
                for vk in measured:
                    src = by_source.get((vk.backend, vk.name, vk.source_sha256))
                    if src is None or vk.tunables == src[1] or idx.failed(vk, problem):
                        continue
                    v, tun = src[0], vk.tunables_dict
                    if set(tun) != set(v.tunables) or v.check(problem, tun, extra=backend.limit_context()):
                        continue
                    got.append((Config.of(v, tun), vk))
            if len(idx.options) > 4096:
                idx.options.clear()
            idx.options[ckey] = got
        return [(c, measured[vk]) for c, vk in got]

    def _search(self, backend, problem, valid, options, idx) -> tuple:
        """Tunable combinations to measure next (the search strategy's proposals, most expected
        gain first) for the variants within :data:`TUNE_WITHIN` of the best measured time, best
        variant first; with ``{Config: predicted time relative to the class's best}``."""
        if not options:
            return [], {}
        from . import search

        strategy = self.strategy
        best_by_variant: dict = {}
        for c, t in options:
            n = c.variant.name
            if n not in best_by_variant or t < best_by_variant[n][1]:
                best_by_variant[n] = (c, t)
        top = min(t for _, t in best_by_variant.values())
        out, predicted = [], {}
        ctx = backend.limit_context()
        start_of = {c.variant.name: c for c in valid}
        proposals = _plan.TUNE_PROPOSALS
        for name, (c, t) in sorted(best_by_variant.items(), key=lambda kv: kv[1][1])[:TUNE_VARIANTS]:
            v = c.variant
            if t > TUNE_WITHIN * top or not v.tunables or name not in start_of:
                continue
            mine = [(o, tt) for o, tt in options if o.variant.name == name]
            if search.stale([tt for _, tt in mine], _plan.TUNE_GAIN) >= _plan.TUNE_PATIENCE:
                continue
            measured = {search.key(o.params): tt for o, tt in mine}
            for combo in v.tunable_space():  # combinations its limits or failures exclude: never proposed
                k = search.key(combo)
                if k not in measured and (
                    not v.allows(problem, combo, ctx) or idx.failed(self.vkey(Config.of(v, combo)), problem)
                ):
                    measured[k] = math.inf
            prior = self._tunable_prior(problem, v, c, idx, [k for k, tt in measured.items() if tt != math.inf])
            for combo in strategy.propose(
                v.tunables, start_of[name].params, measured, proposals - len(out), prior=prior
            ):
                cfg = Config.of(v, combo)
                out.append(cfg)
                k = search.key(combo)
                predicted[cfg] = (t / top) * (math.exp(prior[k]) if k in prior else _plan.TUNE_RATIO)
            if len(out) >= proposals:
                break
        return out, predicted

    def _tunable_prior(self, problem, variant, best, idx, measured_here) -> dict:
        """{tunables key: predicted ln(time / time of ``best``)} for combinations of ``variant``
        measured elsewhere on this device: the cost model's prediction where it models both, else
        the weighted mean over the nearest classes (of the cvtype and dtype) that measured both.
        Combinations nothing predicts are left out (the strategy puts them after the predicted
        gains, before the predicted losses)."""
        from . import search

        if not idx.classes:
            return {}
        name, model, _, _ = idx.predictor(problem.cvtype, problem.dtype)
        bk = self.vkey(best)
        coords = (math.log(max(problem.N, 1)), math.log(problem.D), math.log(problem.M))
        out: dict = {}
        combos = {
            search.key(combo): self.vkey(Config.of(variant, combo))
            for combo in variant.tunable_space()
            if search.key(combo) not in measured_here
        }
        if model is not None:
            pb = model.predict(bk, *coords)
            if pb is not None:
                for k, vk in combos.items():
                    p = model.predict(vk, *coords)
                    if p is not None:
                        out[k] = p - pb
        near = [(d, idx.scores(ck)) for d, ck in idx.nearest(problem)[: 2 * NEIGHBOURS]]
        for k, vk in combos.items():
            if k in out:
                continue
            num = den = 0.0
            for d, per in near:
                if vk in per and bk in per and per[bk] > 0:
                    w = 1.0 / (d + 0.25)
                    num += w * math.log(per[vk] / per[bk])
                    den += w
            if den:
                out[k] = num / den
        return out

    @staticmethod
    def _tuned_elsewhere(backend, problem, keys, idx) -> dict:
        """{VariantKey: Config}: tuned configurations of the candidates (``keys``: {VariantKey:
        Config}) measured in other classes of the cvtype and dtype, whose limits allow ``problem``
        and that never failed on it."""
        by_source = {(vk.backend, vk.name, vk.source_sha256): c.variant for vk, c in keys.items()}
        out, ctx = {}, None
        for vk in sorted(idx.measured_keys(problem.cvtype, problem.dtype) - set(keys), key=str):
            v = by_source.get((vk.backend, vk.name, vk.source_sha256))
            if v is None or idx.failed(vk, problem):
                continue
            tun = vk.tunables_dict
            ctx = backend.limit_context() if ctx is None else ctx
            if set(tun) == set(v.tunables) and v.allows(problem, tun, extra=ctx):
                out[vk] = Config.of(v, tun)
        return out

    def _rank(self, backend, problem, valid, idx):
        """Candidates best-first by the prediction for the problem's class.

        Returns ``(ranking, predicted?, {config: (ln(t / t_best predicted), classes it rests on)},
        one line saying how)``. The predictor is the cost model where it beats the nearest-neighbour
        rule by leave-one-out on this history, else the nearest-neighbour rule."""
        base = rule_order(backend, valid, problem.kernel_cvtype)
        keys = {self.vkey(c): c for c in base}
        name, model, loo_nn, loo_model = idx.predictor(problem.cvtype, problem.dtype)
        if model is not None:
            # the model also ranks tuned configurations of the candidates measured in other classes
            # (each modelled from enough classes; nearest neighbour would favour the rarely measured)
            tuned = self._tuned_elsewhere(backend, problem, keys, idx)
            keys = {**keys, **tuned}
            base = base + list(tuned.values())
        pos = {c: i for i, c in enumerate(base)}
        if model is not None:
            ranked = model.rank(list(keys), math.log(max(problem.N, 1)), math.log(problem.D), math.log(problem.M))
            if ranked:
                lo = ranked[0][0]
                # evidence: the classes of this cvtype and dtype each configuration's model rests on
                rel = {keys[k]: (p - lo, model.n.get(k, 0)) for p, k in ranked}
                ranking = sorted(base, key=lambda c: (0, rel[c][0], pos[c]) if c in rel else (1, 0.0, pos[c]))
                return (
                    ranking,
                    True,
                    rel,
                    (f"cost model (leave-one-out {100 * loo_model:.0f}% against nearest {100 * loo_nn:.0f}%)"),
                )
        score, weight, count, used = {}, {}, {}, 0
        nearest = idx.nearest(problem)
        for d, ck in nearest:
            per = idx.scores(ck)
            here = [(per[vk], vk) for vk in keys if vk in per]
            if len(here) < 2:
                continue
            fastest = min(t for t, _ in here)
            w = 1.0 / (d + 0.25)
            for t, vk in here:
                score[vk] = score.get(vk, 0.0) + w * math.log(t / fastest)
                weight[vk] = weight.get(vk, 0.0) + w
                count[vk] = count.get(vk, 0) + 1
            used += 1
            if used >= NEIGHBOURS:
                break
        if not score:
            return base, False, {}, "rule order (nothing measured nearby)"
        ranking = sorted(
            base,
            key=lambda c: (
                (0, score[self.vkey(c)] / weight[self.vkey(c)], pos[c]) if self.vkey(c) in score else (1, 0.0, pos[c])
            ),
        )
        raw = {keys[vk]: score[vk] / weight[vk] for vk in score}
        lo = min(raw.values())
        rel = {c: (v - lo, count[self.vkey(c)]) for c, v in raw.items()}
        how = f"nearest {used} measured class(es)"
        tuned = self._tuned_nearby(backend, problem, ranking[0], idx, nearest)
        if tuned is not None:
            ranking = [tuned] + ranking
            how += f"; tunables {tuned.label} from the nearest classes that measured them"
        return ranking, True, rel, how

    def _tuned_nearby(self, backend, problem, top, idx, nearest):
        """A tuned configuration of ``top``'s variant that the nearest classes measuring it beside
        ``top`` find faster than ``top`` (weighted mean log-ratio, as the nearest rule; at least
        two classes, so that one lucky timing does not decide), or None. The nearest rule ranks
        the candidates' default configurations; without this an unseen shape would run the
        default tunables even where every neighbour measured a tuned configuration 5-40 % faster."""
        tk = self.vkey(top)
        tuned = self._tuned_elsewhere(backend, problem, {tk: top}, idx)
        if not tuned:
            return None
        score, weight, count, used = {}, {}, {}, 0
        for d, ck in nearest:  # (distance, class key) nearest first, as _rank computed them
            per = idx.scores(ck)
            if tk not in per:
                continue
            here = [vk for vk in tuned if vk in per]
            if not here:
                continue
            w = 1.0 / (d + 0.25)
            for vk in here:
                score[vk] = score.get(vk, 0.0) + w * math.log(per[vk] / per[tk])
                weight[vk] = weight.get(vk, 0.0) + w
                count[vk] = count.get(vk, 0) + 1
            used += 1
            if used >= NEIGHBOURS:
                break
        best = min(
            (vk for vk in score if count[vk] >= 2), key=lambda vk: (score[vk] / weight[vk], str(vk)), default=None
        )
        return tuned[best] if best is not None and score[best] < 0 else None

    def record(
        self,
        backend,
        problem,
        config,
        status,
        seconds=None,
        cov_seconds=None,
        repeats=1,
        sampled_from: int | None = None,
    ) -> None:
        if status == "ok" and not (seconds and seconds > 0):
            return
        history = self.history()
        if history is None:
            return
        device_id, fp = self._device(backend)
        try:
            history.record(
                device_id,
                fp,
                self.vkey(config),
                problem.N,
                problem.D,
                problem.M,
                problem.cvtype,
                problem.dtype,
                status,
                seconds,
                cov_seconds,
                repeats,
                threads=backend.run_threads(problem),
                sampled_from=sampled_from,
            )
        except Exception as exc:  # noqa: BLE001 - a broken history must not break train()
            self._disable(history, exc)

    def flush(self) -> None:
        h = self.history()
        if h is not None:
            h.flush()
