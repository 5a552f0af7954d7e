"""A code variant as data: :class:`Variant` (what a manifest under ``variants/`` declares),
:class:`Config` (a variant with concrete tunables) and the limit expressions their manifests
state (:func:`evaluate`: arithmetic, comparisons and min/max/abs over the problem, the tunables and
the device's quantities, never arbitrary code).

Loading the declarations, looking variants up and rendering their templates is
:mod:`asp_gmm.registry`'s job (which re-exports these names); this module imports nothing of the
package but the problem (and the history's key type, on request), so that the selection can name a
configuration without reaching the registry.
"""

from __future__ import annotations

import ast
import itertools
import operator
from dataclasses import dataclass, field
from functools import lru_cache

from .problem import Problem


@dataclass(frozen=True)
class Limit:
    require: str
    reason: str


@dataclass(frozen=True)
class Variant:
    """A code variant described by its manifest."""

    name: str
    backend: str
    phase: str
    template: str
    cvtypes: tuple
    dtypes: tuple
    description: str
    tunables: dict = field(hash=False, compare=False)
    limits: tuple = ()
    source_sha256: str = ""
    #: The backend-specific manifest keys of :data:`MANIFEST_KEYS` (e.g. a CUDA variant's ``[[launch]]``
    #: tables and ``scratch`` expression); read by the backend that owns the variant. Unknown keys are
    #: rejected when the manifest is loaded, never kept here.
    extra: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def key(self) -> str:
        """Stable identifier: backend/name."""
        return f"{self.backend}/{self.name}"

    @property
    def takes_weights(self) -> bool:
        """Whether a weighted fit can run this variant on a backend whose kernels take sample weights
        (its manifest's ``sample_weight``, default true)."""
        return bool(self.extra.get("sample_weight", True))

    def default_tunables(self) -> dict:
        return {k: v[0] for k, v in self.tunables.items()}

    def tunable_space(self):
        """Every combination of tunable values, defaults first."""
        names = list(self.tunables)
        for combo in itertools.product(*(self.tunables[n] for n in names)):
            yield dict(zip(names, combo))

    @property
    def limits_name_n(self) -> bool:
        """Whether any limit depends on N (the number of events); when none does, whether the
        variant allows a problem does not change with N and callers may memoise by shape."""
        return any("N" in _compiled(lim.require).co_names for lim in self.limits) or any(
            "N" in _compiled(e).co_names for e in self.extra.get("derived", {}).values()
        )

    def derive(self, env: dict) -> dict:
        """``env`` with the manifest's ``[derived]`` quantities added, in their declared order (each
        may use the problem, the tunables, the limit context and the quantities before it). One
        definition serves the limits, the launch expressions and the template, so a geometry the
        template computes is never re-derived by hand in the manifest."""
        for name, expr in self.extra.get("derived", {}).items():
            env[name] = evaluate(expr, env)
        return env

    def check(self, problem: Problem, tunables: dict | None = None, extra: dict | None = None):
        """Return ``None`` when the variant can run the problem, else the reason it cannot."""
        if problem.cvtype not in self.cvtypes:
            return f"{self.key} does not implement cvtype={problem.cvtype!r}"
        if problem.dtype not in self.dtypes:
            return f"{self.key} does not implement dtype={problem.dtype!r}"
        env = dict(problem.as_dict())
        env.update(self.default_tunables())
        env.update(tunables or {})
        env.update(extra or {})
        self.derive(env)
        for lim in self.limits:
            if not evaluate(lim.require, env):
                return f"{self.key}: {lim.reason} (requires {lim.require}; N={problem.N}, D={problem.D}, M={problem.M})"
        return None

    def selectable_for(self, problem: Problem, extra: dict | None = None) -> bool:
        """Whether the selection may offer this variant for ``problem``: the manifest's ``selectable``
        (default true; an expression is evaluated like a limit, with the default tunables). A variant
        that is not selectable still runs when pinned."""
        sel = self.extra.get("selectable", True)
        if isinstance(sel, bool):
            return sel
        env = dict(problem.as_dict())
        env.update(self.default_tunables())
        env.update(extra or {})
        self.derive(env)
        return bool(evaluate(sel, env))

    def allows(self, problem: Problem, tunables: dict | None = None, extra: dict | None = None) -> bool:
        return self.check(problem, tunables, extra) is None

    def first_allowed(self, problem: Problem, extra: dict | None = None) -> dict | None:
        """The first combination of tunables, defaults first, whose limits allow ``problem``; ``None``
        when none does. A default that selects a faster code path with narrower limits (V7's tensor
        cores) then falls back to the next path instead of removing the variant from the problem."""
        return next((t for t in self.tunable_space() if self.allows(problem, t, extra)), None)


@dataclass(frozen=True)
class Config:
    """A variant with concrete tunables: the one name for "a variant with its tunables".

    Hashable (the tunables are sorted ``(name, value)`` pairs). A backend's compiled
    :class:`asp_gmm.backends.base.Kernel` carries one (``kernel.config``); the history stores it as a
    :class:`asp_gmm.tuning_db.VariantKey` (:meth:`history_key`), which adds nothing but the source hash
    in a form the history (which imports nothing of the package) can keep.

    Attributes
    ----------
    variant : Variant
    tunables : tuple of (str, value)
        Every tunable of the variant (defaults filled in), sorted by name.
    """

    variant: Variant
    tunables: tuple = ()

    @classmethod
    def of(cls, variant: Variant, tunables: dict | None = None) -> "Config":
        """The variant with its defaults overridden by ``tunables``."""
        t = variant.default_tunables()
        t.update(tunables or {})
        return cls(variant, tuple(sorted(t.items())))

    @property
    def params(self) -> dict:
        """The tunables as a dict."""
        return dict(self.tunables)

    @property
    def label(self) -> str:
        """``name`` or ``name(k=v,...)``, as the CLI and the logs show it."""
        if not self.tunables:
            return self.variant.name
        return self.variant.name + "(" + ",".join(f"{k}={v}" for k, v in self.tunables) + ")"

    def history_key(self):
        """The :class:`asp_gmm.tuning_db.VariantKey` under which the history stores this config."""
        from .tuning_db import VariantKey

        return VariantKey.of(self.variant.backend, self.variant.name, self.params, self.variant.source_sha256)


# ---------------------------------------------------------------- limit expressions
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
}
_CMPOPS = {
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_FUNCS = {"min": min, "max": max, "abs": abs}


def evaluate(expr: str, env: dict):
    """Evaluate a limit expression: arithmetic, comparisons, and/or/not, min/max/abs over names."""
    try:
        return eval(_compiled(expr), {"__builtins__": {}, **_FUNCS}, env)  # noqa: S307 - checked by _check
    except NameError as exc:
        raise KeyError(f"limit expression names unknown quantity {exc.name!r}") from None


@lru_cache(maxsize=None)
def _compiled(expr: str):
    """The expression compiled once, after :func:`_check` has allowed every construct in it (the
    launch expressions are evaluated for every session, so walking the tree each time was slow)."""
    tree = ast.parse(expr, mode="eval")
    _check(tree.body)
    return compile(tree, f"<limit {expr!r}>", "eval")


def _check(node):
    """Raise ValueError unless ``node`` uses only constants, names, arithmetic, comparisons,
    and/or/not, tuples and calls of min/max/abs."""
    ok = (
        isinstance(node, (ast.Constant, ast.Name, ast.Tuple, ast.List, ast.BoolOp))
        or isinstance(node, ast.BinOp)
        and type(node.op) in _BINOPS
        or isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.Not))
        or isinstance(node, ast.Compare)
        and all(type(op) in _CMPOPS for op in node.ops)
        or isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCS
        and not node.keywords
    )
    if not ok:
        raise ValueError(f"unsupported construct in limit expression: {ast.dump(node)}")
    children = {
        ast.BinOp: lambda n: (n.left, n.right),
        ast.UnaryOp: lambda n: (n.operand,),
        ast.BoolOp: lambda n: n.values,
        ast.Compare: lambda n: (n.left, *n.comparators),
        ast.Call: lambda n: n.args,
        ast.Tuple: lambda n: n.elts,
        ast.List: lambda n: n.elts,
    }
    for child in children.get(type(node), lambda n: ())(node):
        _check(child)
