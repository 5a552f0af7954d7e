"""A sample's ranking checked on the whole data (issue 37): which configurations timed only on
samples of a class run on the data, and which configuration runs the call meanwhile (see the
package documentation, *A sample's ranking checked on the data*)."""

from __future__ import annotations

from . import plan as _plan
from .index import problem_class
from .plan import rule_order


def checks(vkey, backend, problem, options, best, idx) -> tuple:
    """``(primary, [config], {config: predicted ratio})``: configurations to run on the whole
    data because they were timed only on samples of the class. Scores of such configurations
    are sampled times scaled by one calibration (that of the configurations measured both
    ways), which cannot reorder them: without this a variant that won on the sample kept the
    class although slower on the data (a sample fits caches the data does not). Checked: the
    best by score when it is timed on samples only, and each variant's best sampled
    configuration within :data:`CONFIRM_WITHIN` of the fastest sampled time that the fixed rule
    puts before the best's variant (what it prefers scales to large data), in the rule's order.
    The primary, which runs the call, is the best configuration timed on the data where there
    is one (the checks then cost what they are predicted to against it), else the best."""
    ck = problem_class(problem)
    full, samp = idx.classes.get(ck, {}), idx.sampled.get(ck, {})
    if not samp:
        return None, [], {}
    fastest = min(a.median for a in samp.values())
    verified = [(c, t) for c, t in options if vkey(c) in full]
    primary = min(verified, key=lambda ct: ct[1])[0] if verified else best[0]
    on_data = {c.variant.name for c, _ in verified}
    per_variant: dict = {}
    for c, _ in options:
        a = samp.get(vkey(c))
        name = c.variant.name
        if a is None or name in on_data or a.median > _plan.CONFIRM_WITHIN * fastest:
            continue
        if name not in per_variant or a.median < per_variant[name][1]:
            per_variant[name] = (c, a.median)
    in_rule = rule_order(backend, [c for c, _ in per_variant.values()] + [best[0]], problem.kernel_cvtype)
    rank = {c.variant.name: i for i, c in enumerate(in_rule)}
    top = rank[best[0].variant.name]
    # the best itself (when timed on samples only), and the variants the rule puts before it:
    # one it puts after, and slower on the sample as well, has nothing that says it might win
    chosen = sorted(
        (ct for ct in per_variant.values() if ct[0] == best[0] or rank[ct[0].variant.name] < top),
        key=lambda ct: (ct[0] != best[0], rank[ct[0].variant.name], ct[1]),
    )
    chosen = [ct for ct in chosen if ct[0] != primary]
    ref = samp.get(vkey(primary))
    base = ref.median if ref is not None else fastest
    return primary, [c for c, _ in chosen], {c: max(t / base, 1.0) for c, t in chosen}
