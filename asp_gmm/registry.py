"""Variants as data: their manifests, their declared limits, and rendering a template to source.

Each variant is a TOML manifest beside its Jinja2 template under ``variants/<backend>/`` (installed as
``asp_gmm.variants``)::

    name = "V3"
    backend = "c"
    phase = "covariance"           # "core" (the EM driver), "covariance", "estep", ...
    template = "cov_v3.c.j2"       # empty for a variant implemented by the backend itself
    cvtypes = ["full", "diag"]
    dtypes = ["float32", "float64"]
    description = "..."
    [tunables]                     # name = list of allowed values; the first is the default
    chunk_tiles = [8, 4, 16]
    [[limits]]                     # a Python-syntax boolean over the problem and the tunables
    require = "D * (D + 1) // 2 <= threads"
    reason = "one thread per covariance cell"

Rendering is one function, :func:`render`: (variant, tunables, problem, backend context) -> source.
"""

from __future__ import annotations

import difflib
import hashlib
import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from .problem import Problem
from .variant import Config, Limit, Variant, _check, _compiled, evaluate  # noqa: F401  (re-exported)

_VARIANTS_PACKAGE = "asp_gmm.variants"


# ---------------------------------------------------------------- manifest schema
@dataclass(frozen=True)
class Key:
    """One manifest key: the TOML type it must have and what it means."""

    types: tuple
    doc: str
    backend_specific: bool = False  # kept in :attr:`Variant.extra` for the backend that owns the variant


#: The manifest schema: every top-level key a ``variants/<backend>/*.toml`` may use. A key not
#: listed here is a typo and :func:`load_manifest` raises naming the file, the key and these keys.
MANIFEST_KEYS = {
    "name": Key((str,), "the variant's name (unique per backend)"),
    "backend": Key((str,), "the backend that runs it (default: the folder's name)"),
    "phase": Key((str,), "'core' (the EM driver), 'covariance', 'estep', ..."),
    "template": Key((str,), "its Jinja2 template; empty when the backend implements it itself"),
    "cvtypes": Key((list,), "covariance types it implements"),
    "dtypes": Key((list,), "dtypes it implements"),
    "description": Key((str,), "one paragraph: what it computes and how it maps onto the hardware"),
    "tunables": Key((dict,), "name = list of allowed values, the first is the default"),
    "limits": Key((list,), "[[limits]] tables: require (expression), reason"),
    "derived": Key((dict,), "name = expression, in order; shared by limits, launches and the template", True),
    "launch": Key((list,), "[[launch]] tables (CUDA): kernel, grid, block, shared, args, phase", True),
    "scratch": Key((str, int), "bytes of scratch memory (CUDA), an expression", True),
    "zero_acc": Key((bool,), "the accumulator is zeroed before the launches (CUDA)", True),
    "estep_moments": Key((bool,), "the E-step also returns the moments the M-step needs (C diag)", True),
    "sample_weight": Key(
        (bool,),
        "false: the variant cannot take sample weights (a CUDA variant whose own E-step fuses the M-step sums); "
        "a weighted fit chooses among the others (default true)",
        True,
    ),
    "rule_ratio": Key(
        (dict,),
        "cvtype = [fastest, slowest]: the default configuration's time against the rule's first choice on "
        "benchmarks/rule_order.py's grid; an unmeasured configuration is priced from it "
        "(asp_gmm.explore.prior_ratio) instead of the backend's unknown_ratio_prior",
        True,
    ),
    "selectable": Key(
        (bool, str),
        "false: never chosen by the selection (pinned or tested only); an expression: offered to the selection "
        "only for the problems where it holds (pinning is not restricted)",
        True,
    ),
}
#: Keys of each ``[[limits]]`` and ``[[launch]]`` table.
LIMIT_KEYS = {
    "require": "a boolean expression over the problem, tunables and limit context",
    "reason": "what the limit protects, shown when it excludes a problem",
}
LAUNCH_KEYS = {
    "kernel": "the __global__ function",
    "grid": "grid expression(s)",
    "block": "block expression(s)",
    "shared": "dynamic shared memory bytes",
    "args": "argument names",
    "phase": "the EM phase it runs in",
}


def _reject_unknown(path, where: str, table: dict, known) -> None:
    from .errors import ManifestError

    for key in table:
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ManifestError(
                f"{path}: unknown key {key!r} in {where}{hint}; the known keys are {', '.join(sorted(known))}"
            )


def load_manifest(path, data: dict) -> dict:
    """Check a parsed manifest against :data:`MANIFEST_KEYS` and return it.

    Parameters
    ----------
    path : str or path-like
        The manifest file, named in errors.
    data : dict
        The parsed TOML.

    Raises
    ------
    asp_gmm.errors.ManifestError
        An unknown key (a typo), a key of the wrong type, or a ``[[limits]]``/``[[launch]]`` table with
        an unknown key; the message names the file, the key and the known keys.
    """
    from .errors import ManifestError

    _reject_unknown(path, "the manifest", data, MANIFEST_KEYS)
    for key, value in data.items():
        spec = MANIFEST_KEYS[key]
        if not isinstance(value, spec.types) or (isinstance(value, bool) and bool not in spec.types):
            want = " or ".join(t.__name__ for t in spec.types)
            raise ManifestError(f"{path}: {key!r} must be a {want} ({spec.doc}), got {value!r}")
    if "name" not in data:
        raise ManifestError(f"{path}: the manifest has no 'name'; add name = \"...\"")
    for i, lim in enumerate(data.get("limits", [])):
        _reject_unknown(path, f"[[limits]] #{i + 1}", lim, LIMIT_KEYS)
        if "require" not in lim:
            raise ManifestError(f"{path}: [[limits]] #{i + 1} has no 'require' expression")
    for i, launch in enumerate(data.get("launch", [])):
        _reject_unknown(path, f"[[launch]] #{i + 1}", launch, LAUNCH_KEYS)
    return data


# ---------------------------------------------------------------- loading


def _variants_root():
    return resources.files(_VARIANTS_PACKAGE)


@lru_cache(maxsize=None)
def _environment(backend: str):
    """The Jinja2 environment of ``backend``'s templates (jinja2 is imported here, on the first
    render: a warm process whose binaries are all cached may never need it)."""
    import jinja2

    from .template_cache import template_code_cache

    root = _variants_root()
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(root / backend), str(root)]),
        # the compiled templates kept in the compile cache: a warm process renders without compiling
        bytecode_cache=template_code_cache(),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


#: A template's references to others: {% include/import/extends "name" %} and {% from "name" import %}
#: (a name that is not a literal cannot be followed, as in jinja2.meta.find_referenced_templates).
_REFERENCE = re.compile(r"""{%-?\s*(?:include|import|extends|from)\s+(["'])([^"']+)\1""")


def _template_closure_sha256(backend: str, template: str) -> str:
    """sha256 over a template and every template it includes, imports or extends (recursively).

    The references are found by a scan of the template text, not by parsing it with Jinja2 (which
    cost a quarter of a second per process for every template of every backend)."""
    root = _variants_root()
    dirs = [root / backend, root]
    seen, order, todo = set(), [], [template]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = next((d / name for d in dirs if (d / name).is_file()), None)
        if path is None:
            raise FileNotFoundError(f"template {name!r} of backend {backend!r} is not under {root}")
        src = path.read_text()
        order.append((name, src))
        todo.extend(m.group(2) for m in _REFERENCE.finditer(src))
    h = hashlib.sha256()
    for name, src in sorted(order):
        h.update(name.encode() + b"\0" + src.encode() + b"\0")
    return h.hexdigest()


@lru_cache(maxsize=None)
def all_variants() -> tuple:
    """Every variant declared under ``variants/``, sorted by backend and name."""
    out = []
    root = _variants_root()
    for backend_dir in sorted(root.iterdir(), key=lambda p: p.name):
        if not backend_dir.is_dir() or backend_dir.name.startswith("_"):
            continue
        for mf in sorted(backend_dir.iterdir(), key=lambda p: p.name):
            if not mf.name.endswith(".toml"):
                continue
            data = load_manifest(f"variants/{backend_dir.name}/{mf.name}", tomllib.loads(mf.read_text()))
            backend = data.get("backend", backend_dir.name)
            template = data.get("template", "")
            if template:
                sha = _template_closure_sha256(backend_dir.name, template)
            else:  # implemented by the backend module itself: the manifest is its source
                sha = hashlib.sha256(mf.read_bytes()).hexdigest()
            out.append(
                Variant(
                    name=data["name"],
                    backend=backend,
                    phase=data.get("phase", "covariance"),
                    template=template,
                    cvtypes=tuple(data.get("cvtypes", ["full", "diag"])),
                    dtypes=tuple(data.get("dtypes", ["float32", "float64"])),
                    description=data.get("description", ""),
                    tunables={k: list(v) for k, v in data.get("tunables", {}).items()},
                    limits=tuple(
                        Limit(l["require"], l.get("reason", "declared limit")) for l in data.get("limits", [])
                    ),
                    source_sha256=sha,
                    extra={k: v for k, v in data.items() if MANIFEST_KEYS[k].backend_specific},
                )
            )
    return tuple(out)


def variants(backend: str | None = None, phase: str | None = None) -> list:
    """Declared variants, optionally filtered by backend and phase."""
    return list(
        _per_declaration(
            ("variants", backend, phase),
            lambda every: tuple(
                v for v in every if (backend is None or v.backend == backend) and (phase is None or v.phase == phase)
            ),
        )
    )


def limits_name_n(backend: str, phase: str) -> bool:
    """Whether any ``phase`` variant of ``backend`` has a limit that depends on N: when none does,
    which of them allow a problem does not change with N, and callers may memoise by shape."""
    return _per_declaration(
        ("names_n", backend, phase), lambda every: any(v.limits_name_n for v in variants(backend, phase))
    )


def _per_declaration(key, compute):
    """``compute(all_variants())``, memoised in the default runtime
    (:attr:`asp_gmm.runtime.Runtime.declarations_memo`) for the current result of
    :func:`all_variants` (asked on every train call; tests reload the declarations)."""
    from .runtime import default_runtime

    every = all_variants()
    memo = default_runtime().declarations_memo
    hit = memo.get(key)
    if hit is None or hit[0] is not every:
        hit = memo[key] = (every, compute(every))
    return hit[1]


def get(backend: str, name: str, phase: str | None = None) -> Variant:
    """The variant ``name`` of ``backend``; ``KeyError`` listing the known names otherwise."""
    for v in variants(backend, phase):
        if v.name.lower() == name.lower():
            return v
    known = ", ".join(v.name for v in variants(backend, phase))
    raise KeyError(f"no variant {name!r} for backend {backend!r}; known: {known}")


def render(variant: Variant, tunables: dict | None, problem: Problem, **context) -> str:
    """Render ``variant``'s template for ``problem`` with ``tunables`` and backend ``context``."""
    if not variant.template:
        raise ValueError(f"{variant.key} has no template: the backend implements it directly")
    params = variant.default_tunables()
    params.update(tunables or {})
    unknown = set(tunables or {}) - set(variant.tunables)
    if unknown:
        raise ValueError(f"{variant.key} has no tunables {sorted(unknown)}; it has {sorted(variant.tunables)}")
    derived = variant.derive({**problem.as_dict(), **params})
    derived = {k: derived[k] for k in variant.extra.get("derived", {})}
    from .cache import digest
    from .template_cache import jinja_identity, load_source, store_source

    # Every input of the rendering: the manifest (its repr), the templates it reads (their sha256),
    # the values the template sees and the Jinja2 that renders.
    key = digest(
        "render",
        repr(variant),
        variant.source_sha256,
        sorted(params.items()),
        repr(problem),
        sorted(problem.as_dict().items()),
        sorted(derived.items()),
        sorted((k, repr(v)) for k, v in context.items()),
        jinja_identity(),
    )
    src = load_source(key)
    if src is None:
        env = _environment(variant.backend)
        tmpl = env.get_template(variant.template)
        src = tmpl.render(problem=problem, variant=variant, **problem.as_dict(), **params, **derived, **context)
        store_source(key, src)
    return src
