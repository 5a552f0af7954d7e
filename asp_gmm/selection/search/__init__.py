"""Search strategies over a variant's tunables, one module per strategy.

A strategy is asked, for one variant in one problem class, which tunable combinations to measure
next, given what is measured so far; it never runs anything. :class:`asp_gmm.selection.Policy`
asks it inside real ``train`` calls (each proposal runs one sampled EM iteration, within the
exploration budget) and ``asp-gmm tune --search NAME`` asks it outside them.

Protocol (:class:`Strategy`)::

    propose(space, start, measured, limit, prior=None) -> list of dict

* ``space``: {tunable name: [values]} as the manifest declares them (first value = default);
* ``start``: the combination to start from (the defaults the limits allow);
* ``measured``: {canonical tuple of (name, value) pairs: seconds per event}, the class's timings
  of this variant (the strategy treats missing combinations as unmeasured);
* ``limit``: the most combinations to return;
* ``prior``: optional {canonical tuple: predicted ln(time / best time)} for unmeasured
  combinations (the cost model, measured neighbours): proposals are ordered by expected gain.

It returns the combinations to measure next, most promising first; an empty list means the
search has converged (nothing left that the strategy would try). Strategies must be
deterministic: the same inputs give the same proposals (tests replay committed histories).
"""

from __future__ import annotations

import importlib
import itertools

from ...errors import ASPGMMError

#: Strategy names -> module (each module defines ``STRATEGY``, an object with ``propose``).
STRATEGIES = {
    "coordinate": "asp_gmm.selection.search.coordinate",
    "exhaustive": "asp_gmm.selection.search.exhaustive",
}
#: The strategy real calls use.
DEFAULT = "coordinate"


class UnknownStrategyError(ASPGMMError, ValueError):
    """A search strategy name that :data:`STRATEGIES` does not list."""


def key(combo: dict) -> tuple:
    """The canonical, hashable form of a tunables combination."""
    return tuple(sorted(combo.items()))


def stale(times, gain: float) -> int:
    """How many of ``times`` (one variant's combinations in a class, in the order measured),
    counted from the last, came after its best so far last improved by the fraction ``gain``:
    the policy ends a variant's search once this reaches its patience, whatever the strategy."""
    best, since = float("inf"), 0
    for t in times:
        if t < best * (1.0 - gain):
            best, since = t, 0
        else:
            since += 1
    return since


def space_size(space: dict) -> int:
    n = 1
    for values in space.values():
        n *= max(len(values), 1)
    return n


def all_combinations(space: dict):
    names = sorted(space)
    for values in itertools.product(*(space[n] for n in names)):
        yield dict(zip(names, values))


def get(name: str | None = None):
    """The strategy object called ``name`` (default :data:`DEFAULT`)."""
    name = name or DEFAULT
    mod = STRATEGIES.get(name)
    if mod is None:
        raise UnknownStrategyError(f"unknown search strategy {name!r}; choose one of {', '.join(sorted(STRATEGIES))}")
    return importlib.import_module(mod).STRATEGY
