"""Exhaustive search: every combination of the tunable space, in manifest order (defaults first).

The reference the cheaper strategies are judged against (``benchmarks/selection.py`` reports the
oracle gain from it); ``asp-gmm tune --tunables`` measures the same set.
"""

from __future__ import annotations

from . import all_combinations, key


class Exhaustive:
    name = "exhaustive"

    def propose(self, space: dict, start: dict, measured: dict, limit: int, prior: dict | None = None) -> list:
        out = []
        prior = prior or {}
        rest = sorted(all_combinations(space), key=lambda c: prior.get(key(c), 0.0))  # stable: manifest order
        for combo in [dict(start)] + rest:
            if key(combo) not in measured and combo not in out:
                out.append(combo)
                if len(out) >= limit:
                    break
        return out


STRATEGY = Exhaustive()
