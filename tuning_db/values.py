"""Plain values of the history and their checks: keys, rows, the default URL, the limits every stored
value is checked against."""

from __future__ import annotations

import json
import logging
import math
import os
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import platformdirs

from .errors import HistoryError
from .schema import CVTYPES, DTYPES, INT_MAX, STATUSES

log = logging.getLogger("asp_gmm.tuning_db")

EXPORT_FORMAT = "asp_gmm-history"
#: Ok timings kept per (device, configuration, problem class, sampled or not); see :class:`History`.
KEEP_PER_CLASS = 16


def bound_class(N, sampled_from=None) -> int:
    """The N class the per-class bound (and the selection) groups a timing in: half-octaves of N,
    of the call's N (``sampled_from``) for a timing on a sample."""
    return round(2 * math.log2(max(sampled_from or N or 1, 1)))


def canonical_json(obj) -> str:
    """Stable text of a JSON-able value (sorted keys, no spaces): used in stored keys."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def default_url(db: str | None = None) -> str:
    """The history's URL: ``db`` (any SQLAlchemy URL, or a plain file path), else an SQLite file in
    the user data folder (``platformdirs.user_data_dir("asp_gmm")/history.sqlite``).

    ``asp_gmm`` passes ``asp_gmm.config.settings().db`` (``$ASP_GMM_DB``). This package imports nothing
    of ``asp_gmm``, so with ``db=None`` (a caller outside the package) it reads ``$ASP_GMM_DB`` itself.
    """
    env = (os.environ.get("ASP_GMM_DB", "") if db is None else db).strip()
    if env:
        return env if "://" in env else "sqlite:///" + str(Path(env).expanduser().absolute())
    return "sqlite:///" + str(Path(platformdirs.user_data_dir("asp_gmm")) / "history.sqlite")


@dataclass(frozen=True)
class VariantKey:
    """What identifies the code that was timed: backend, name, tunables, source hash."""

    backend: str
    name: str
    tunables: str = "{}"  # canonical JSON of the tunables
    source_sha256: str = ""

    @classmethod
    def of(cls, backend: str, name: str, tunables: dict | None, source_sha256: str) -> "VariantKey":
        return cls(backend, name, canonical_json(dict(tunables or {})), source_sha256)

    @property
    def tunables_dict(self) -> dict:
        return json.loads(self.tunables)


@dataclass
class Row:
    """One stored timing or failure."""

    device_id: str
    variant: VariantKey
    N: int
    D: int
    M: int
    cvtype: str
    dtype: str
    status: str
    seconds: float | None = None
    cov_seconds: float | None = None
    repeats: int = 1
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc).replace(tzinfo=None))
    package_version: str = ""
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)
    id: int | None = None  # database id, once stored
    threads: int | None = None  # CPU threads the run used (None: not a CPU run, or not recorded)
    sampled_from: int | None = None  # N of the call whose events were sampled (None: the whole data)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _row_to_json(r: Row) -> dict:
    d = asdict(r)
    d.pop("id")
    d["variant"] = asdict(r.variant)
    d["created_at"] = r.created_at.isoformat()
    return d


class _Bad(ValueError):
    """A value that does not belong in a history row: ``field`` and what is wrong with it."""

    def __init__(self, field: str, why: str):
        self.field, self.why = field, why
        super().__init__(f"{field}: {why}")


def _show(v) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _int(v, field: str, lo: int = 1, hi: int = INT_MAX) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise _Bad(field, f"must be an integer, got {_show(v)}")
    if not lo <= v <= hi:
        raise _Bad(field, f"must be between {lo} and {hi}, got {_show(v)}")
    return v


def _seconds(v, field: str, ok_zero: bool = False):
    if v is None:
        return None
    if (
        isinstance(v, bool)
        or not isinstance(v, (int, float))
        or not math.isfinite(v)
        or v < 0
        or (v == 0 and not ok_zero)
    ):
        raise _Bad(
            field,
            f"must be a {'non-negative' if ok_zero else 'positive'} finite number of seconds or null, got {_show(v)}",
        )
    return float(v)


def _text(v, field: str, maxlen: int, empty_ok: bool = False) -> str:
    if not isinstance(v, str) or (not v and not empty_ok):
        raise _Bad(field, f"must be a{'' if empty_ok else ' non-empty'} string, got {_show(v)}")
    if len(v) > maxlen:
        raise _Bad(field, f"must be at most {maxlen} characters, got {len(v)}")
    return v


def _finite_pos(v) -> bool:
    return type(v) is float and 0.0 < v < math.inf


def _check_values(N, D, M, cvtype, dtype, status, seconds, cov_seconds, repeats) -> None:
    """Raise :class:`_Bad` for a timing's values that no asp_gmm writes."""
    # the values every asp_gmm writes, in one expression (a history of 10 000 rows is read at the
    # start of every process); anything else is checked field by field below for the message
    if (
        type(N) is int
        and type(D) is int
        and type(M) is int
        and type(repeats) is int
        and 0 < N <= INT_MAX
        and 0 < D <= INT_MAX
        and 0 < M <= INT_MAX
        and 0 < repeats <= INT_MAX
        and cvtype in CVTYPES
        and dtype in DTYPES
        and status in STATUSES
        and (_finite_pos(seconds) or (seconds is None and status != "ok"))
        and (cov_seconds is None or (type(cov_seconds) is float and 0.0 <= cov_seconds < math.inf))
    ):
        return
    for name, v in (("N", N), ("D", D), ("M", M)):
        _int(v, name)
    for name, v, known in (("cvtype", cvtype, CVTYPES), ("dtype", dtype, DTYPES), ("status", status, STATUSES)):
        if v not in known:
            raise _Bad(name, f"must be one of {', '.join(known)}, got {_show(v)}")
    if _seconds(seconds, "seconds") is None and status == "ok":
        raise _Bad("seconds", "must be a positive number of seconds for an ok timing, got null")
    _seconds(cov_seconds, "cov_seconds", ok_zero=True)
    _int(repeats, "repeats")


def _tunables_problem(text):
    """``None`` when ``text`` is the JSON of an object (as VariantKey stores tunables), else what is wrong."""
    if not isinstance(text, str):
        return f"must be the JSON text of an object, got {_show(text)}"
    try:
        obj = json.loads(text)
    except ValueError:
        return f"is not valid JSON: {_show(text)}"
    if not isinstance(obj, dict):
        return f"must be the JSON of an object, got {_show(text)}"
    return None


def _fingerprint_problem(text):
    try:
        obj = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        obj = None
    return None if isinstance(obj, dict) else f"fingerprint is not the JSON of an object: {_show(text)}"


def _timestamp(v) -> datetime:
    if isinstance(v, datetime):
        return v
    try:
        t = datetime.fromisoformat(v)
    except (TypeError, ValueError):
        raise _Bad("created_at", f"must be an ISO date and time, got {_show(v)}") from None
    if t.tzinfo is not None:
        t = t.astimezone(timezone.utc).replace(tzinfo=None)
    return t


def _parse_export(doc: dict, path) -> tuple:
    """``(devices {id: fingerprint}, rows)`` of an export document, every value checked; a bad one
    raises :class:`HistoryError` naming the row and the field (nothing is imported)."""

    def fail(where, b):
        field = f"{where}.{b.field}" if b.field else where
        return HistoryError(f"{path}: {field} {b.why}; nothing was imported")

    devs, timings = doc.get("devices", []), doc.get("timings", [])
    for name, v in (("devices", devs), ("timings", timings)):
        if not isinstance(v, list):
            raise HistoryError(f"{path}: {name} must be a list, got {_show(v)}; nothing was imported")
    devices = {}
    for i, d in enumerate(devs):
        try:
            if not isinstance(d, dict):
                raise _Bad("", f"must be an object with an id and a fingerprint, got {_show(d)}")
            did = _text(d.get("id"), "id", 64)
            fp = d.get("fingerprint")
            if not isinstance(fp, dict):
                raise _Bad("fingerprint", f"must be an object (the device's fingerprint), got {_show(fp)}")
        except _Bad as b:
            raise fail(f"devices[{i}]", b) from None
        devices[did] = fp
    rows, seen = [], {}
    for i, t in enumerate(timings):
        try:
            if not isinstance(t, dict):
                raise _Bad("", f"must be an object, got {_show(t)}")
            uid = _text(t.get("uid"), "uid", 32)
            if uid in seen:
                raise _Bad("uid", f"{uid!r} appears twice (also timings[{seen[uid]}])")
            seen[uid] = i
            dev = _text(t.get("device_id"), "device_id", 64)
            if dev not in devices:
                raise _Bad("device_id", f"{dev!r} names a device the file does not describe")
            v = t.get("variant")
            if not isinstance(v, dict):
                raise _Bad("variant", f"must be an object (backend, name, tunables, source_sha256), got {_show(v)}")
            backend = _text(v.get("backend"), "variant.backend", 32)
            name = _text(v.get("name"), "variant.name", 64)
            tunables = v.get("tunables", "{}")
            why = _tunables_problem(tunables)
            if why:
                raise _Bad("variant.tunables", why)
            tunables = _text(canonical_json(json.loads(tunables)), "variant.tunables", 512)
            sha = _text(v.get("source_sha256", ""), "variant.source_sha256", 64, empty_ok=True)
            N, D, M = t.get("N"), t.get("D"), t.get("M")
            cvtype, dtype, status = t.get("cvtype"), t.get("dtype"), t.get("status")
            seconds, cov_seconds, repeats = t.get("seconds"), t.get("cov_seconds"), t.get("repeats", 1)
            _check_values(N, D, M, cvtype, dtype, status, seconds, cov_seconds, repeats)
            created_at = _timestamp(t.get("created_at"))
            pv = _text(t.get("package_version", ""), "package_version", 32, empty_ok=True)
            threads = t.get("threads")
            if threads is not None and (
                not isinstance(threads, int) or isinstance(threads, bool) or not 0 < threads <= INT_MAX
            ):
                raise _Bad("threads", f"must be a positive integer or null, got {_show(threads)}")
            sampled_from = t.get("sampled_from")
            if sampled_from is not None and (
                not isinstance(sampled_from, int) or isinstance(sampled_from, bool) or not 0 < sampled_from <= INT_MAX
            ):
                raise _Bad("sampled_from", f"must be a positive integer or null, got {_show(sampled_from)}")
        except _Bad as b:
            raise fail(f"timings[{i}]", b) from None
        rows.append(
            Row(
                device_id=dev,
                variant=VariantKey(backend, name, tunables, sha),
                N=N,
                D=D,
                M=M,
                cvtype=cvtype,
                dtype=dtype,
                status=status,
                seconds=_seconds(seconds, "seconds"),
                cov_seconds=_seconds(cov_seconds, "cov_seconds", ok_zero=True),
                repeats=repeats,
                created_at=created_at,
                package_version=pv,
                uid=uid,
                threads=threads,
                sampled_from=sampled_from,
            )
        )
    return devices, rows


# ---------------------------------------------------------------------------------- migrations
