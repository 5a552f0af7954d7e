"""Which variant runs a problem: pure policy, no compiling and no running.

The specializer hands a :class:`Selector` the problem, the device and the candidate configurations
(variant + tunables) whose declared limits allow the problem; the selector answers with a
:class:`Plan`: the configuration for the bulk of the iterations and, optionally, configurations to
try for one iteration each first (exploration). After running, the specializer reports every
measured timing and every failure back through :meth:`Selector.record`.

:class:`RuleSelector` is the fixed, documented rule used when no history is available:
the first configuration of the backend's preference list (:data:`PREFERENCE`) that is a candidate.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from .problem import Problem
from .registry import Variant

log = logging.getLogger("asp_gmm.selection")


@dataclass(frozen=True)
class Config:
    """A variant with concrete tunables."""

    variant: Variant
    tunables: tuple = ()   # sorted (name, value) pairs, hashable

    @classmethod
    def of(cls, variant: Variant, tunables: dict | None = None) -> "Config":
        t = variant.default_tunables()
        t.update(tunables or {})
        return cls(variant, tuple(sorted(t.items())))

    @property
    def params(self) -> dict:
        return dict(self.tunables)

    @property
    def label(self) -> str:
        if not self.tunables:
            return self.variant.name
        return self.variant.name + "(" + ",".join(f"{k}={v}" for k, v in self.tunables) + ")"


@dataclass
class Plan:
    primary: Config
    explore: list = field(default_factory=list)
    reason: str = ""


#: Rule for each backend when nothing has been measured: names in order of preference, with the
#: reason. C: V4 splits the events, so all cores work for any M (V3 idles cores when M is small);
#: other backends declare a ``preference`` attribute (list of names) that takes precedence.
PREFERENCE = {
    "c": ["V4", "V3", "BLAS", "V2", "V1"],
    "numpy": ["reference"],
}


def autotune_enabled() -> bool:
    """``ASP_GMM_AUTOTUNE=0`` turns measuring and exploring off."""
    return os.environ.get("ASP_GMM_AUTOTUNE", "1").strip().lower() not in ("0", "false", "no", "off")


class Selector:
    """Interface; also the history-free rule."""

    def plan(self, backend, problem: Problem, candidates: list, pinned: bool = False) -> Plan:
        raise NotImplementedError

    def record(self, backend, problem: Problem, config: Config, status: str,
               seconds: float | None = None, cov_seconds: float | None = None, repeats: int = 1) -> None:
        """Report one measurement (status "ok") or failure ("compile-failed", "launch-failed",
        "invalid"). The rule keeps nothing."""


class RuleSelector(Selector):
    """The documented fixed rule (no history, no exploration)."""

    def plan(self, backend, problem, candidates, pinned=False) -> Plan:
        if not candidates:
            raise ValueError(f"no variant of backend {backend.name!r} can run {problem}")
        if pinned or len(candidates) == 1:
            return Plan(candidates[0], [], "pinned" if pinned else "only candidate")
        order = list(getattr(backend, "preference", None) or PREFERENCE.get(backend.name, []))
        rank = {n: i for i, n in enumerate(order)}
        best = min(candidates, key=lambda c: rank.get(c.variant.name, len(order)))
        log.debug("rule: %s for %s on %s", best.label, problem, backend.name)
        return Plan(best, [], "rule")


_default: Selector | None = None


def default_selector() -> Selector:
    """The selector the specializer uses unless given one."""
    global _default
    if _default is None:
        _default = RuleSelector()
    return _default


def set_default_selector(selector: Selector | None) -> None:
    global _default
    _default = selector
