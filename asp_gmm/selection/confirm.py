"""A sample's ranking checked on the whole data (issue 37): which configurations timed only on
samples of a class run on the data, and which configuration runs the call meanwhile (see the
package documentation, *A sample's ranking checked on the data*)."""

from __future__ import annotations

from . import plan as _plan
from .index import problem_class
from .plan import rule_order


def checks(vkey, backend, problem, options, best, idx) -> tuple:
    """``(primary, [config], {config: predicted ratio}, {config: sampled seconds per event})``:
    configurations to run on the whole data because they were timed only on samples of the class.
    Scores of such configurations are sampled times scaled by one calibration (that of the
    configurations measured both ways), which cannot reorder them: without this a variant that won on the sample kept the
    class although slower on the data (a sample fits caches the data does not).

    Checked, each variant's best sampled configuration (variants timed on the data left out): the
    best by score when timed on samples only (it would take the class), and the variants the
    fixed rule puts before it (what it prefers scales to large data) within
    :data:`CONFIRM_WITHIN` of the fastest sampled time; where a configuration was timed on the
    data, only those whose sampled time per event is below the best time there (they win unless
    they lose more to the data's size: the 2-core CPU at N = 1.5 M had V4 1.6x V2 on the sample
    and 2.9x faster on the data). On a backend whose samples under-fill the device
    (:attr:`~asp_gmm.backends.base.Backend.samples_underfill`: a GPU) wherever the rule puts
    them, compared with the fastest sampled time only (the primary's included).

    In the rule's order. The primary, which runs the call, is the best configuration timed on the
    data where there is one, else the best; a check's predicted ratio is its sampled time over the
    primary's time on the data (its sampled time where it has none, or where samples under-fill
    the device), at least 1; the seconds per event returned price it on the data (its sampled
    time, scaled there by the primary's data over sampled time)."""
    ck = problem_class(problem)
    full, samp = idx.classes.get(ck, {}), idx.sampled.get(ck, {})
    if not samp:
        return None, [], {}, {}
    fastest = min(a.median for a in samp.values())
    verified = [(c, t) for c, t in options if vkey(c) in full]
    on_data = {c.variant.name for c, _ in verified}
    per_variant: dict = {}
    for c, _ in options:
        a = samp.get(vkey(c))
        name = c.variant.name
        if a is None or name in on_data:
            continue
        if name not in per_variant or a.median < per_variant[name][1]:
            per_variant[name] = (c, a.median)
    in_rule = rule_order(backend, [c for c, _ in per_variant.values()] + [best[0]], problem.kernel_cvtype)
    rank = {c.variant.name: i for i, c in enumerate(in_rule)}
    # the variants the rule puts before the best's and close to the fastest on the sample: one the
    # rule puts after, and slower on the sample as well, has nothing that says it might win, unless
    # the backend's samples under-fill it (a GPU: at (500 000, 36, 128) full on an H200 V8 ran
    # slower than V5 on a 32 768-event sample and 1.3x faster on the data, and was checked there
    # only once every other variant and tunable had been explored, nine calls later)
    underfills = getattr(backend, "samples_underfill", False)
    top = rank[best[0].variant.name]
    picked = [
        ct
        for ct in per_variant.values()
        if ct[0] == best[0]
        or ((underfills or rank[ct[0].variant.name] < top) and ct[1] <= _plan.CONFIRM_WITHIN * fastest)
    ]
    scale = 1.0  # what a sampled time per event is taken to cost on the data
    if verified:
        primary, on_data_t = min(verified, key=lambda ct: ct[1])
        ref = samp.get(vkey(primary)) if underfills else None
        if ref is None:
            # ... and, where a configuration ran on the data, faster on the sample than it there
            picked = [ct for ct in picked if ct[0] == best[0] or ct[1] < on_data_t]
            base = on_data_t
        else:
            # a sample that under-fills the device costs more per event than the data: compared
            # with the primary's own sampled time, and priced by that ratio on the data
            base, scale = ref.median, on_data_t / ref.median
    else:
        primary = best[0]
        ref = samp.get(vkey(primary))
        base = ref.median if ref is not None else fastest
    chosen = sorted((ct for ct in picked if ct[0] != primary), key=lambda ct: (rank[ct[0].variant.name], ct[1]))
    return (
        primary,
        [c for c, _ in chosen],
        {c: max(t / base, 1.0) for c, t in chosen},
        {c: t * scale for c, t in chosen},
    )
