"""The ``asp-gmm`` command: tune, history, info.

    asp-gmm tune --N 10000,100000 --D 19,36 --M 1,16,128 [--cvtype full] [--backend c|cuda] [--repeats 5]
    asp-gmm history list | export FILE | import FILE | repair | clear
    asp-gmm info

``tune`` sweeps the grid (progress bar), records every timing in the history (the same keys that
``train`` uses), prints the times and winners per problem and writes a PNG heat map of the winning
variant and its gain over V1 per (D, M), one panel per N. ``history export``/``import`` move a
measured history (JSON) to another machine of the same kind, like FFTW wisdom: rows are keyed by
the device fingerprint, so they only serve an identical device.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def _history():
    from . import __version__
    from .tuning_db import History
    return History(package_version=__version__)


def _backend(name):
    from .backends import get_backend
    return get_backend(name)


# ---------------------------------------------------------------------------------- tune
def cmd_tune(args) -> int:
    from . import autotune
    from .problem import Problem
    from .selection import HistorySelector

    Ns, Ds, Ms = autotune.parse_grid(args.N), autotune.parse_grid(args.D), autotune.parse_grid(args.M)
    for cv in args.cvtype:
        Problem(1, 1, 1, cv, args.dtype)  # validates
    backend = _backend(args.backend)
    history = _history()
    selector = HistorySelector(history)
    variants = set(args.variants.split(",")) if args.variants else None
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
    bar = tqdm(total=total, unit="config", desc="tuning", disable=args.quiet or None, file=sys.stderr) \
        if tqdm else None
    results = {}
    try:
        for p in problems:
            if not plans[p]:
                continue
            if bar is not None:
                bar.set_postfix_str(f"N={p.N} D={p.D} M={p.M}")
            results[p] = autotune.measure(backend, p, plans[p], repeats=args.repeats, seed=args.seed,
                                          max_seconds=args.max_seconds, record=record,
                                          on_config=(lambda c: bar.update(1)) if bar is not None else None)
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
            autotune.heatmap(results, args.out, args.baseline,
                             title=f"{backend.name}: winning variant and time saved vs always {args.baseline}")
            print(f"heat map: {args.out}")
        except ImportError as exc:  # pragma: no cover - matplotlib is in the tune extra
            print(f"no heat map ({exc}); pip install matplotlib", file=sys.stderr)
    if args.json:
        doc = [{"N": p.N, "D": p.D, "M": p.M, "cvtype": p.cvtype, "dtype": p.dtype,
                "results": [{"config": m.label, "variant": m.config.variant.name, "status": m.status,
                             "seconds": m.seconds, "cov_seconds": m.cov_seconds, "samples": m.samples}
                            for m in ms]} for p, ms in results.items()]
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
            print(f"{'when (UTC)':19}  {'device':16}  {'variant':28} {'N':>8} {'D':>4} {'M':>4} "
                  f"{'cv':4} {'dtype':7} {'status':14} {'ms/iter':>9} {'reps':>4}")
        for r in rows:
            tun = r.variant.tunables_dict
            label = r.variant.name + ("(" + ",".join(f"{k}={v}" for k, v in sorted(tun.items())) + ")" if tun else "")
            ms = f"{1e3 * r.seconds:.3f}" if r.seconds is not None else "-"
            print(f"{r.created_at:%Y-%m-%d %H:%M:%S}  {r.device_id:16}  {label[:28]:28} {r.N:8d} {r.D:4d} {r.M:4d} "
                  f"{r.cvtype:4} {r.dtype:7} {r.status:14} {ms:>9} {r.repeats:4d}")
        return 0
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


# ---------------------------------------------------------------------------------- info
def cmd_info(args) -> int:
    from . import __version__, backends, cache, registry
    from .tuning_db import SCHEMA_VERSION, default_url
    print(f"asp_gmm {__version__}")
    print(f"cache folder: {cache.cache_dir()}")
    print(f"database URL: {default_url()}  (schema version {SCHEMA_VERSION}; set ASP_GMM_DB to change it)")
    try:
        h = _history()
        print(f"  {h.count()} timings of {len(h.devices())} device(s)")
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        print(f"  cannot be opened: {exc}")
    print(f"autotuning: {'on' if os.environ.get('ASP_GMM_AUTOTUNE', '1') not in ('0', 'false', 'no', 'off') else 'off'}"
          " (ASP_GMM_AUTOTUNE)")
    names = [args.backend] if args.backend else list(backends._BACKENDS)
    for name in names:
        reason = backends.unavailable_reason(name)
        if reason:
            print(f"\nbackend {name}: not available ({reason})")
        else:
            be = backends.get_backend(name)
            print(f"\nbackend {name}: device {be.device_id}")
            for k, v in be.fingerprint().items():
                print(f"  {k}: {', '.join(map(str, v)) if isinstance(v, (list, tuple)) else v}")
            ctx = be.limit_context()
            if ctx:
                print("  limit context: " + ", ".join(f"{k}={v}" for k, v in ctx.items()))
        for v in registry.variants(name, "covariance"):
            print(f"  variant {v.name}  [{v.source_sha256[:12]}]  {v.description}")
            print(f"    cvtypes {', '.join(v.cvtypes)}; dtypes {', '.join(v.dtypes)}")
            if v.tunables:
                print("    tunables: " + "; ".join(f"{k} in {vals} (default {vals[0]})" for k, vals in v.tunables.items()))
            for lim in v.limits:
                print(f"    limit: {lim.require}  ({lim.reason})")
    return 0


# ---------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="asp-gmm", description="asp_gmm: tune variants, manage the tuning history")
    sub = ap.add_subparsers(dest="command", required=True)

    t = sub.add_parser("tune", help="measure every variant over a grid of problems and record the timings")
    t.add_argument("--N", required=True, help="events, comma-separated (e.g. 10000,100000)")
    t.add_argument("--D", required=True, help="dimensions, comma-separated")
    t.add_argument("--M", required=True, help="components, comma-separated")
    t.add_argument("--cvtype", default="full", type=lambda s: s.split(","), help="full, diag or full,diag")
    t.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    t.add_argument("--backend", default="c", help="c, cuda or numpy (default c)")
    t.add_argument("--repeats", type=int, default=5, help="EM iterations timed per configuration (median)")
    t.add_argument("--max-seconds", type=float, default=None,
                   help="stop repeating a configuration once it has used this many seconds")
    t.add_argument("--tunables", action="store_true", help="also every combination of the variants' tunables")
    t.add_argument("--variants", default="", help="only these variants (comma-separated names)")
    t.add_argument("--baseline", default="V1", help="variant the gain is measured against (default V1)")
    t.add_argument("--out", default="asp_gmm_tune.png", help="PNG heat map (empty: none)")
    t.add_argument("--json", default="", help="also write the measurements to this JSON file")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.set_defaults(fn=cmd_tune)

    h = sub.add_parser("history", help="list, export, import or clear the tuning history")
    hs = h.add_subparsers(dest="action", required=True)
    hl = hs.add_parser("list", help="devices and the newest timings")
    hl.add_argument("--limit", type=int, default=50)
    he = hs.add_parser("export", help="write the whole history to a JSON file")
    he.add_argument("file")
    hi = hs.add_parser("import", help="add the rows of an exported JSON file (same schema version)")
    hi.add_argument("file")
    hs.add_parser("repair", help="delete damaged rows (values no asp_gmm writes), which reading skips with a warning")
    hc = hs.add_parser("clear", help="delete every timing")
    hc.add_argument("--yes", action="store_true", help="do not ask")
    h.set_defaults(fn=cmd_history)

    i = sub.add_parser("info", help="device fingerprint, cache folder, database URL, variants and their limits")
    i.add_argument("--backend", default=None)
    i.set_defaults(fn=cmd_info)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import ASPGMMError
    from .tuning_db import HistoryError
    try:
        return args.fn(args)
    except (HistoryError, ASPGMMError, ValueError, OSError) as exc:
        print(f"asp-gmm {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
