"""Exhaustive search: every combination of the tunable space, in manifest order (defaults first).

The reference the cheaper strategies are judged against (``benchmarks/selection.py`` reports the
oracle gain from it); ``asp-gmm tune --tunables`` measures the same set.
"""

from __future__ import annotations

from . import all_combinations, key


class Exhaustive:
    name = "exhaustive"

    def propose(self, space: dict, start: dict, measured: dict, limit: int) -> list:
        out = []
        for combo in [dict(start)] + list(all_combinations(space)):
            if key(combo) not in measured and combo not in out:
                out.append(combo)
                if len(out) >= limit:
                    break
        return out


STRATEGY = Exhaustive()
