"""The ``asp-gmm`` command: tune, history, info.

    asp-gmm tune --N 10000,100000 --D 19,36 --M 1,16,128 [--cvtype full] [--backend c|cuda] [--repeats 5]
    asp-gmm history list | export FILE | import FILE | repair | clear --yes
    asp-gmm info [--verbose]
    asp-gmm --version

``tune`` sweeps the grid (progress bar), records every timing in the history (the same keys that
``train`` uses), prints the times and winners per problem and writes a PNG heat map of the winning
variant and its gain over V1 per (D, M), one panel per N. ``history export``/``import`` move a
measured history (JSON) to another machine of the same kind, like FFTW wisdom: rows are keyed by
the device fingerprint, so they only serve an identical device.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings

from .config import settings
from .problem import CVTYPES


def _history():
    from ._version import __version__
    from .tuning_db import History, default_url

    return History(default_url(settings().db), package_version=__version__)


def _backend(name):
    from .backends import get_backend

    return get_backend(name)


# ---------------------------------------------------------------------------------- tune
def cmd_tune(args) -> int:
    from . import autotune
    from .problem import Problem
    from .selection import HistorySelector

    from . import registry

    Ns, Ds, Ms = args.N, args.D, args.M
    for cv in args.cvtype:
        Problem(1, 1, 1, cv, args.dtype)  # validates
    small = sorted({(n, m) for n in Ns for m in Ms if n < m})
    if small:
        pairs = ", ".join(f"N={n} < M={m}" for n, m in small[:4]) + (", ..." if len(small) > 4 else "")
        print(
            f"asp-gmm tune: a GMM needs at least as many events as components ({pairs}); drop N values below "
            f"{max(Ms)} or M values above {min(Ns)}",
            file=sys.stderr,
        )
        return 2
    backend = _backend(args.backend)
    variants = None
    if args.variants:
        known = {v.name.lower(): v.name for v in registry.variants(backend.name, "covariance")}
        wanted = [w.strip() for w in args.variants.split(",") if w.strip()]
        unknown = [w for w in wanted if w.lower() not in known]
        if unknown or not wanted:
            print(
                f"asp-gmm tune: unknown variant {', '.join(unknown) or repr(args.variants)} for backend "
                f"{backend.name}; known: {', '.join(sorted(known.values()))}",
                file=sys.stderr,
            )
            return 2
        variants = {known[w.lower()] for w in wanted}
    if args.repeats < 3:
        warnings.warn(
            f"--repeats {args.repeats}: single timings are noise (other load, clock changes, first-touch "
            "effects); the history keeps them and train() may choose by them. Use --repeats 3 or more "
            "(the default is 5).",
            RuntimeWarning,
            stacklevel=2,
        )
    history = _history()
    selector = HistorySelector(history)
    problems = [p for cv in args.cvtype for p in autotune.grid(Ns, Ds, Ms, cv, args.dtype)]
    plans = {p: autotune.configs_for(backend, p, args.tunables, variants) for p in problems}
    skipped = [p for p in problems if not plans[p]]
    for p in skipped:
        print(f"no {backend.name} variant can run N={p.N}, D={p.D}, M={p.M} ({p.cvtype}); skipped", file=sys.stderr)

    def record(problem, config, status, seconds, cov_seconds, repeats):
        selector.record(backend, problem, config, status, seconds, cov_seconds, repeats)

    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm is in the tune extra
        tqdm = None
    total = sum(len(c) for c in plans.values())
    bar = tqdm(total=total, unit="config", desc="tuning", disable=args.quiet or None, file=sys.stderr) if tqdm else None
    results = {}
    try:
        for p in problems:
            if not plans[p]:
                continue
            if bar is not None:
                bar.set_postfix_str(f"N={p.N} D={p.D} M={p.M}")
            results[p] = autotune.measure(
                backend,
                p,
                plans[p],
                repeats=args.repeats,
                seed=args.seed,
                max_seconds=args.max_seconds,
                record=record,
                on_config=(lambda c: bar.update(1)) if bar is not None else None,
            )
            history.flush()
    finally:
        if bar is not None:
            bar.close()
        history.flush()
    print(f"device {backend.name} {backend.device_id}: {backend.fingerprint().get('model', '')}")
    print(autotune.table(results, args.baseline))
    failed = [(p, m) for p, ms in results.items() for m in ms if m.status != "ok"]
    for p, m in failed:
        print(f"  N={p.N} D={p.D} M={p.M}: {m.label} {m.status}: {m.error}")
    print(f"{sum(len(ms) for ms in results.values())} timings recorded in {history.where}")
    if args.out and results:
        try:
            autotune.heatmap(
                results,
                args.out,
                args.baseline,
                title=f"{backend.name}: winning variant, its speed-up over always {args.baseline}, "
                "its ms per EM iteration",
            )
            print(f"heat map: {args.out}")
        except ImportError as exc:  # matplotlib is in the tune extra
            print(f"no heat map ({exc}); pip install 'asp_gmm[tune]' (or pass --out '')", file=sys.stderr)
    if args.json:
        doc = [
            {
                "N": p.N,
                "D": p.D,
                "M": p.M,
                "cvtype": p.cvtype,
                "dtype": p.dtype,
                "results": [
                    {
                        "config": m.label,
                        "variant": m.config.variant.name,
                        "status": m.status,
                        "seconds": m.seconds,
                        "cov_seconds": m.cov_seconds,
                        "samples": m.samples,
                    }
                    for m in ms
                ],
            }
            for p, ms in results.items()
        ]
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


# ---------------------------------------------------------------------------------- history
def cmd_history(args) -> int:
    h = _history()
    if args.action == "list":
        devices = h.devices()
        print(f"history: {h.url if not h.is_sqlite else h.path}  ({h.count()} rows)")
        for dev, fp, n in devices:
            print(f"  device {dev}: {fp.get('backend', '?')} {fp.get('model', '')}  {n} rows")
        rows = h.rows(newest_first=True, limit=args.limit)
        if rows:
            print(
                f"{'when (UTC)':19}  {'device':16}  {'variant':28} {'N':>8} {'D':>4} {'M':>4} "
                f"{'cv':4} {'dtype':7} {'status':14} {'ms/iter':>9} {'reps':>4}"
            )
        for r in rows:
            tun = r.variant.tunables_dict
            label = r.variant.name + ("(" + ",".join(f"{k}={v}" for k, v in sorted(tun.items())) + ")" if tun else "")
            ms = f"{1e3 * r.seconds:.3f}" if r.seconds is not None else "-"
            print(
                f"{r.created_at:%Y-%m-%d %H:%M:%S}  {r.device_id:16}  {label[:28]:28} {r.N:8d} {r.D:4d} {r.M:4d} "
                f"{r.cvtype:4} {r.dtype:7} {r.status:14} {ms:>9} {r.repeats:4d}"
            )
        return 0
    if args.action == "why":
        return _why(args)
    if args.action == "export":
        n = h.export(args.file)
        print(f"exported {n} rows to {args.file}")
        return 0
    if args.action == "import":
        added, skipped = h.import_(args.file)
        print(f"imported {added} rows from {args.file}" + (f" ({skipped} already present)" if skipped else ""))
        return 0
    if args.action == "repair":
        n = h.repair()
        print(f"deleted {n} damaged row(s) from {h.where}" if n else f"nothing to repair in {h.where}")
        return 0
    if args.action == "clear":
        if not args.yes:
            if not sys.stdin.isatty():
                print("refusing to clear the history without --yes", file=sys.stderr)
                return 2
            if input(f"delete every timing in {h.where}? [y/N] ").strip().lower() not in ("y", "yes"):
                return 1
        n = h.clear()
        print(f"deleted {n} rows from {h.where}")
        return 0
    raise AssertionError(args.action)  # pragma: no cover


def _why(args) -> int:
    """What ``train`` would run for one problem on this device, and why (the plan, the pruned
    candidates, the predictor with its leave-one-out scores, the tunable search)."""
    from . import selection
    from .problem import Problem
    from .specializer import Specializer

    backend = _backend(args.backend)
    sp = Specializer(backend)
    p = Problem(args.N, args.D, args.M, args.cvtype, args.dtype)
    plan = sp.policy.choose(backend, p, sp.candidates(p), tuning=selection.autotune_enabled())
    print(f"{backend.name} N={p.N} D={p.D} M={p.M} {p.cvtype} {p.dtype}: runs {plan.primary.label} ({plan.reason})")
    if plan.why:
        print(f"  why: {plan.why}")
    if plan.explore:
        print(
            f"  explores first (one iteration each, on a sample at large N): {', '.join(c.label for c in plan.explore)}"
        )
    if plan.pruned:
        print(f"  not explored (predicted far slower): {', '.join(c.label for c in plan.pruned)}")
    print(f"  budget: {_budget_line(sp, backend, p)}")
    return 0


def _budget_line(sp, backend, p) -> str:
    """What exploring has spent in the problem's class against the allowance (the history's
    sampled iterations against its whole-data ones)."""
    from . import selection

    sel = sp.policy.selector
    try:
        idx = sel.index(backend) if isinstance(sel, selection.HistorySelector) and sel.history() else None
    except Exception as exc:  # noqa: BLE001 - a broken history is reported, not raised
        return f"unknown ({exc})"
    spent = None if idx is None else idx.spent.get(selection.problem_class(p))
    allowance = (
        f"allowance {100 * selection.EXPLORE_FRACTION:.0f} % of each call, "
        f"{100 * selection.TUNE_FRACTION:.0f} % for the tunable search"
    )
    if not spent or not spent[2]:
        return f"nothing explored on samples in this class yet ({allowance})"
    share = spent[0] / (spent[0] + spent[1]) if spent[0] + spent[1] > 0 else 0.0
    return (
        f"exploring spent {spent[0]:.3g} s on {spent[2]} sampled iteration(s) in this class against "
        f"{spent[1]:.3g} s of whole-data iterations ({100 * share:.1f} % of the time; {allowance})"
    )


# ---------------------------------------------------------------------------------- info
def cmd_info(args) -> int:
    from . import backends, cache, registry
    from ._version import __version__
    from .tuning_db import SCHEMA_VERSION, default_url

    print(f"asp_gmm {__version__}")
    try:
        print(f"cache folder: {cache.cache_dir()}")
    except OSError as exc:  # info reports, it does not fail
        print(f"cache folder: unusable: {exc}")
    print(f"database URL: {default_url(settings().db)}  (schema version {SCHEMA_VERSION}; set ASP_GMM_DB to change it)")
    try:
        h = _history()
        print(f"  {h.count()} timings of {len(h.devices())} device(s)")
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        print(f"  cannot be opened: {exc}")
    print(f"autotuning: {'on' if settings().autotune else 'off'} (ASP_GMM_AUTOTUNE)")
    names = [args.backend] if args.backend else list(backends._BACKENDS)
    for name in names:
        reason = backends.unavailable_reason(name)
        if reason:
            print(f"\nbackend {name}: not available ({reason})")
        else:
            be = backends.get_backend(name)
            fp = be.fingerprint()
            print(f"\nbackend {name}: device {be.device_id}")
            for k, v in fp.items():
                if k == "compiler" or (k == "backend" and not args.verbose):
                    continue
                print(f"  {k}: {', '.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
            if "compiler" in fp:
                print(f"  compiler: {cache.short_version(fp['compiler'])}")
            ctx = be.limit_context()
            if ctx and args.verbose:
                print("  limit context: " + ", ".join(f"{k}={v}" for k, v in ctx.items()))
        if reason and registry.variants(name, "covariance"):
            print(f"  its variants (none can run here without the {name} backend):")
        for v in registry.variants(name, "covariance"):
            desc = v.description if args.verbose or len(v.description) <= 72 else v.description[:70].rstrip() + " ..."
            print(f"  variant {v.name:6} [{v.source_sha256[:12]}]  {desc}")
            if not args.verbose:
                continue
            print(f"    cvtypes {', '.join(v.cvtypes)}; dtypes {', '.join(v.dtypes)}")
            if v.tunables:
                print(
                    "    tunables: " + "; ".join(f"{k} in {vals} (default {vals[0]})" for k, vals in v.tunables.items())
                )
            for lim in v.limits:
                print(f"    limit: {lim.require}  ({lim.reason})")
    if not args.verbose:
        print("\n(asp-gmm info --verbose adds each variant's tunables and limits, and the full compiler text)")
    elif any(not backends.unavailable_reason(n) for n in names):
        for name in names:
            if not backends.unavailable_reason(name):
                full = backends.get_backend(name).fingerprint().get("compiler")
                if full:
                    print(f"{name} compiler, in full: {full}")
    return 0


# ---------------------------------------------------------------------------------- main
def _positive_int(text: str) -> int:
    try:
        v = float(str(text).strip().replace("_", ""))
    except ValueError:
        v = None
    if v is None or v != int(v) or v < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return int(v)


def _grid(text: str) -> list:
    """``"10000,100000"`` or ``"1e4,1e5"``: positive integers, comma-separated."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer or a comma-separated list of them")
    out = []
    for p in parts:
        try:
            out.append(_positive_int(p))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"{p.strip()!r} is not a positive integer" + (f" (in {text!r})" if len(parts) > 1 else "")
            ) from None
    return out


def _cvtypes(text: str) -> list:
    out = [p.strip() for p in str(text).split(",") if p.strip()]
    bad = [p for p in out if p not in CVTYPES]
    if bad or not out:
        raise argparse.ArgumentTypeError(f"{text!r}: each covariance type must be one of {', '.join(CVTYPES)}")
    return out


class _Help(argparse.HelpFormatter):
    """Every option's default in its help: "(default: 5)", '(default: "")' for an empty text,
    "(default: none)"; not for required options, flags and positional arguments."""

    def _get_help_string(self, action):
        text = action.help or ""
        if (
            not action.option_strings
            or action.required
            or action.default is argparse.SUPPRESS
            or action.nargs == 0
            or "default" in text
        ):
            return text
        d = action.default
        shown = '""' if d == "" else "none" if d is None else ",".join(map(str, d)) if isinstance(d, list) else str(d)
        return f"{text} (default: {shown.replace('%', '%%')})"


def build_parser() -> argparse.ArgumentParser:
    from ._version import __version__

    fmt = _Help
    ap = argparse.ArgumentParser(
        prog="asp-gmm", description="asp_gmm: tune variants, manage the tuning history", formatter_class=fmt
    )
    ap.add_argument("--version", action="version", version=f"asp-gmm (asp_gmm) {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser(
        "tune", help="measure every variant over a grid of problems and record the timings", formatter_class=fmt
    )
    t.add_argument("--N", required=True, type=_grid, help="events, comma-separated (e.g. 10000,100000 or 1e4,1e5)")
    t.add_argument("--D", required=True, type=_grid, help="dimensions, comma-separated")
    t.add_argument("--M", required=True, type=_grid, help="components, comma-separated (each at most every N)")
    t.add_argument("--cvtype", default="full", type=_cvtypes, help="full, diag or full,diag")
    t.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="working precision")
    t.add_argument("--backend", default="c", choices=["c", "cuda", "numpy", "auto"], help="where the variants run")
    t.add_argument(
        "--repeats",
        type=_positive_int,
        default=5,
        help="EM iterations timed per configuration (the median is kept); fewer than 3 is noise",
    )
    t.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="stop repeating a configuration once it has used this many seconds",
    )
    t.add_argument("--tunables", action="store_true", help="also every combination of the variants' tunables")
    t.add_argument("--variants", default="", help="only these variants, comma-separated (empty: every one)")
    t.add_argument("--baseline", default="V1", help="variant the gain is measured against")
    t.add_argument("--out", default="asp_gmm_tune.png", help="PNG heat map (empty: none)")
    t.add_argument("--json", default="", help="also write the measurements to this JSON file (empty: none)")
    t.add_argument("--seed", type=int, default=0, help="seed of the random test data")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(fn=cmd_tune)

    h = sub.add_parser("history", help="list, export, import, repair or clear the tuning history", formatter_class=fmt)
    hs = h.add_subparsers(dest="action", required=True)
    hl = hs.add_parser("list", help="devices and the newest timings", formatter_class=fmt)
    hl.add_argument("--limit", type=_positive_int, default=50, help="timings shown, newest first")
    hw = hs.add_parser(
        "why", help="which configuration train() would run for a problem on this device, and why", formatter_class=fmt
    )
    hw.add_argument("--N", type=_positive_int, required=True, help="events")
    hw.add_argument("--D", type=_positive_int, required=True, help="dimensions")
    hw.add_argument("--M", type=_positive_int, required=True, help="components")
    hw.add_argument("--cvtype", default="full", choices=list(CVTYPES), help="covariance type")
    hw.add_argument("--dtype", default="float32", choices=["float32", "float64"], help="working precision")
    hw.add_argument("--backend", default="c", help="c or cuda")
    he = hs.add_parser("export", help="write the whole history to a JSON file", formatter_class=fmt)
    he.add_argument("file", help="JSON file to write")
    hi = hs.add_parser(
        "import",
        help="add the rows of an exported JSON file (same schema version; checked whole before anything is written)",
        formatter_class=fmt,
    )
    hi.add_argument("file", help="JSON file written by `asp-gmm history export`")
    hs.add_parser(
        "repair",
        help="delete damaged rows (values no asp_gmm writes), which reading skips with a warning",
        formatter_class=fmt,
    )
    hc = hs.add_parser("clear", help="delete every timing", formatter_class=fmt)
    hc.add_argument("--yes", action="store_true", help="do not ask")
    h.set_defaults(fn=cmd_history)

    i = sub.add_parser(
        "info",
        help="device fingerprint, cache folder, database URL, variants (--verbose: their tunables and limits)",
        formatter_class=fmt,
    )
    i.add_argument(
        "--backend", default=None, choices=["c", "cuda", "numpy"], help="only this backend (default: every one)"
    )
    i.add_argument("--verbose", "-v", action="store_true", help="also tunables, limits and the full compiler text")
    i.set_defaults(fn=cmd_info)
    return ap


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"asp-gmm: {category.__name__}: {message}", file=sys.stderr if file is None else file)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import ASPGMMError
    from .tuning_db import HistoryError  # the history's own base class (asp_gmm.errors derives from it)

    with warnings.catch_warnings():
        warnings.showwarning = _show_warning  # one line each, not the source line that warned
        try:
            return args.fn(args)
        except (HistoryError, ASPGMMError, ValueError, OSError) as exc:
            print(f"asp-gmm {args.command}: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            print(f"asp-gmm {args.command}: interrupted", file=sys.stderr)
            return 130
        except Exception as exc:  # noqa: BLE001 - never a raw traceback; ASP_GMM_DEBUG=1 shows it
            if settings().debug:
                raise
            print(
                f"asp-gmm {args.command}: unexpected {type(exc).__name__}: {exc} (a bug: please report it; "
                "ASP_GMM_DEBUG=1 shows the traceback)",
                file=sys.stderr,
            )
            return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
