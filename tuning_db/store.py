"""The store: open a history, record timings, read them back, export and import them.

It takes plain values only (a device id and fingerprint dict, a :class:`VariantKey`, problem sizes)
and imports nothing of the backends or the public API.

Writing
    :meth:`History.record` queues a row in memory and makes it visible to :meth:`History.view` at
    once; rows reach the database in batches: when the queue holds ``batch_rows`` rows, when the
    last write is more than ``flush_interval`` seconds old (checked on every record and by the
    selector on every plan), on :meth:`History.flush`, and at interpreter exit (``atexit``). One
    batch is one transaction, so a small ``train`` called thousands of times costs one commit per
    second, not one per call. A process killed outright loses at most its unflushed queue; what was
    committed stays (SQLite: WAL journal, ``synchronous=NORMAL``).
Concurrency (SQLite)
    WAL journal (readers never block the writer), ``busy_timeout`` of 30 s, write transactions
    opened with ``BEGIN IMMEDIATE`` (no lock-upgrade deadlock) and retried with back-off when the
    database is still locked. Rows carry a random ``uid``: a retried or re-imported batch never
    duplicates a row.
Reading
    :meth:`History.view` keeps every row of one device in memory (loaded once per process) and
    refreshes it incrementally (rows with a larger id than seen) at most every
    ``refresh_interval`` seconds, so that planning on a warm history costs no query.
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import random
import threading
import time
import uuid
import weakref
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import platformdirs
from sqlalchemy import create_engine, delete, event, func, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, OperationalError

from .models import SCHEMA_VERSION, STATUSES, Base, Device, SchemaInfo, Timing, Variant

log = logging.getLogger("asp_gmm.tuning_db")

EXPORT_FORMAT = "asp_gmm-history"


class HistoryError(Exception):
    """The history cannot be used; the message names the database and what to do."""


class SchemaMismatchError(HistoryError):
    """A database or export file of another schema version."""


def canonical_json(obj) -> str:
    """Stable text of a JSON-able value (sorted keys, no spaces): used in stored keys."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def default_url() -> str:
    """``$ASP_GMM_DB`` (any SQLAlchemy URL, or a plain file path), else an SQLite file in the user
    data folder (``platformdirs.user_data_dir("asp_gmm")/history.sqlite``)."""
    env = os.environ.get("ASP_GMM_DB", "").strip()
    if env:
        return env if "://" in env else "sqlite:///" + str(Path(env).expanduser().absolute())
    return "sqlite:///" + str(Path(platformdirs.user_data_dir("asp_gmm")) / "history.sqlite")


@dataclass(frozen=True)
class VariantKey:
    """What identifies the code that was timed: backend, name, tunables, source hash."""

    backend: str
    name: str
    tunables: str = "{}"          # canonical JSON of the tunables
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
    id: int | None = None         # database id, once stored


class DeviceView:
    """Every row of one device, in memory; ``rows`` only grows (``generation`` counts additions)."""

    def __init__(self, device_id: str):
        self.device_id = device_id
        self.rows: list = []
        self.uids: set = set()
        self.max_id = 0
        self.loaded_at = 0.0
        self.generation = 0

    def _add(self, row: Row) -> bool:
        if row.id is not None:
            self.max_id = max(self.max_id, row.id)
        if row.uid in self.uids:
            return False
        self.uids.add(row.uid)
        self.rows.append(row)
        self.generation += 1
        return True


_open_histories: "weakref.WeakSet[History]" = weakref.WeakSet()


def _flush_all_at_exit():  # pragma: no cover - exercised by the subprocess tests
    for h in list(_open_histories):
        try:
            h.flush()
        except Exception as exc:  # noqa: BLE001 - never raise at exit; say what was lost
            log.warning("asp_gmm: could not save %d timing(s) to %s at exit: %s", len(h._pending), h.where, exc)


atexit.register(_flush_all_at_exit)


def _after_fork_in_child():  # pragma: no cover - exercised by multiprocessing users
    for h in list(_open_histories):
        h._pending.clear()            # the parent writes its own queue
        h._engine.dispose(close=False)  # never share the parent's connections
        h._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class History:
    """A tuning history at ``url`` (default :func:`default_url`).

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://user@host/db``...) or a file path.
    package_version : str
        Stored with every row.
    batch_rows, flush_interval : int, float
        Write policy (see the module documentation).
    refresh_interval : float
        How stale an in-memory :meth:`view` may get before rows written by other processes are read.

    Raises
    ------
    HistoryError
        The database cannot be opened, is corrupt, is not an asp_gmm history, or has another schema
        version; the message names it and says what to do.
    """

    def __init__(self, url: str | None = None, package_version: str = "", batch_rows: int = 256,
                 flush_interval: float = 1.0, refresh_interval: float = 5.0):
        self.url = url or default_url()
        if "://" not in self.url:
            self.url = "sqlite:///" + str(Path(self.url).expanduser().absolute())
        self.package_version = package_version
        self.batch_rows, self.flush_interval, self.refresh_interval = batch_rows, flush_interval, refresh_interval
        self._lock = threading.RLock()
        self._pending: list = []
        self._last_flush = time.monotonic()  # a batch starts when the history is opened
        self._views: dict = {}
        self._variant_ids: dict = {}
        self._known_devices: set = set()
        self._fingerprints: dict = {}
        try:
            u = make_url(self.url)
        except ArgumentError as exc:
            raise HistoryError(f"ASP_GMM_DB={self.url!r} is not a database URL ({exc}); use e.g. "
                               "sqlite:///path/history.sqlite or postgresql+psycopg://user@host/db") from None
        self.is_sqlite = u.get_backend_name() == "sqlite"
        self.path = u.database if self.is_sqlite else None
        self.where = self.path if self.is_sqlite else u.render_as_string(hide_password=True)
        self._engine = self._make_engine(u)
        self._open()
        _open_histories.add(self)

    # ------------------------------------------------------------------ opening
    def _make_engine(self, u):
        if not self.is_sqlite:
            try:
                return create_engine(u, pool_pre_ping=True)
            except ImportError as exc:
                raise HistoryError(f"the database driver for {self.where} is not installed ({exc}); "
                                   "install it (e.g. pip install 'psycopg[binary]') or unset ASP_GMM_DB") from None
        if self.path in (None, "", ":memory:"):
            raise HistoryError("an in-memory SQLite history would be lost at exit and is not shared between "
                               "connections; give a file: sqlite:///path/history.sqlite")
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(u, connect_args={"timeout": 30.0})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None   # we emit BEGIN ourselves (below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("asp_gmm_write")
                                 else "BEGIN")
        return engine

    def _fix(self) -> str:
        if self.is_sqlite:
            return f"move {self.path} away (or delete it to start a new history), or set ASP_GMM_DB to another location"
        return "check the server and the URL in ASP_GMM_DB, or unset ASP_GMM_DB to use the local SQLite file"

    def _translate(self, exc: Exception, doing: str) -> HistoryError:
        msg = str(getattr(exc, "orig", None) or exc)
        if self.is_sqlite and ("not a database" in msg or "malformed" in msg or "encrypted" in msg):
            return HistoryError(f"the tuning history {self.path} is corrupt or not an SQLite file ({msg}); "
                                f"{self._fix()}")
        return HistoryError(f"could not {doing} the tuning history {self.where}: {msg}; {self._fix()}")

    def _open(self):
        def create_or_check():
            with self._write() as conn:
                tables = set(inspect(conn).get_table_names())
                if SchemaInfo.__tablename__ not in tables:
                    if tables:
                        raise HistoryError(
                            f"{self.where} is a database but not an asp_gmm tuning history (it has the "
                            f"tables {sorted(tables)[:5]} and no {SchemaInfo.__tablename__}); {self._fix()}")
                    Base.metadata.create_all(conn)
                    conn.execute(SchemaInfo.__table__.insert().values(
                        id=1, version=SCHEMA_VERSION, created_by=f"asp_gmm {self.package_version}".strip(),
                        created_at=_now()))
                return conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1)).scalar()
        try:
            try:
                version = self._run(create_or_check, "open")
            except HistoryError:
                if self.is_sqlite:
                    raise
                # PostgreSQL: another process may have created the tables between our check and ours
                version = self._run(create_or_check, "open")
        except HistoryError:
            self._engine.dispose()
            raise
        if version != SCHEMA_VERSION:
            self._engine.dispose()
            raise SchemaMismatchError(
                f"the tuning history {self.where} has schema version {version}, this asp_gmm uses "
                f"{SCHEMA_VERSION}; export what you need with the asp_gmm that wrote it, then {self._fix()}")

    # ------------------------------------------------------------------ transactions
    def _write(self):
        """A connection in a write transaction (``BEGIN IMMEDIATE`` on SQLite)."""
        return _WriteTx(self._engine)

    def _run(self, fn, doing: str):
        """Run ``fn()`` (which opens its own transaction), retrying while the database is locked
        (and, on a server, after losing a race to insert the same device or variant)."""
        delay = 0.02
        for attempt in range(12):
            try:
                return fn()
            except DatabaseError as exc:
                # a rolled-back transaction may have inserted ids we cached: forget them
                self._variant_ids.clear()
                self._known_devices.clear()
                msg = str(exc.orig).lower()
                transient = (isinstance(exc, OperationalError) and ("locked" in msg or "busy" in msg)) or (
                    isinstance(exc, IntegrityError) and attempt < 2)
                if transient and attempt < 11:
                    time.sleep(delay * (1 + random.random()))
                    delay = min(2 * delay, 1.0)
                    continue
                raise self._translate(exc, doing) from None

    # ------------------------------------------------------------------ writing
    def record(self, device_id: str, fingerprint: dict, variant: VariantKey, N: int, D: int, M: int,
               cvtype: str, dtype: str, status: str, seconds: float | None = None,
               cov_seconds: float | None = None, repeats: int = 1) -> Row:
        """Queue one timing (``status="ok"``) or failure; it is visible to :meth:`view` at once."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if status == "ok" and (seconds is None or not seconds > 0):
            raise ValueError(f"an ok timing needs seconds > 0, got {seconds!r}")
        row = Row(device_id, variant, int(N), int(D), int(M), cvtype, dtype, status,
                  None if seconds is None else float(seconds),
                  None if cov_seconds is None else float(cov_seconds), int(repeats),
                  package_version=self.package_version)
        with self._lock:
            if device_id not in self._fingerprints:
                self._fingerprints[device_id] = dict(fingerprint)
            self._pending.append(row)
            view = self._views.get(device_id)
            if view is not None:
                view._add(row)
            if len(self._pending) >= self.batch_rows or time.monotonic() - self._last_flush >= self.flush_interval:
                self.flush()
        return row

    def maybe_flush(self) -> None:
        """Flush when rows are queued and the last write is older than ``flush_interval``."""
        if self._pending and time.monotonic() - self._last_flush >= self.flush_interval:
            self.flush()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> int:
        """Write the queued rows in one transaction; return how many."""
        with self._lock:
            rows = list(self._pending)
            if not rows:
                self._last_flush = time.monotonic()
                return 0
            self._run(lambda: self._insert(rows, skip_existing=False), "write to")
            del self._pending[:len(rows)]
            self._last_flush = time.monotonic()
            return len(rows)

    def _insert(self, rows, skip_existing: bool, devices: dict | None = None) -> int:
        with self._write() as conn:
            fps = dict(self._fingerprints)
            fps.update(devices or {})
            for dev in {r.device_id for r in rows}:
                self._ensure_device(conn, dev, fps.get(dev, {}))
            existing = set()
            if skip_existing:
                uids = [r.uid for r in rows]
                for i in range(0, len(uids), 500):
                    existing.update(conn.execute(select(Timing.uid).where(Timing.uid.in_(uids[i:i + 500]))).scalars())
            cols = ("uid", "device_id", "variant_id", "N", "D", "M", "cvtype", "dtype", "seconds", "cov_seconds",
                    "repeats", "status", "created_at", "package_version")
            values = [(r.uid, r.device_id, self._variant_id(conn, r.variant), r.N, r.D, r.M, r.cvtype, r.dtype,
                       r.seconds, r.cov_seconds, r.repeats, r.status, r.created_at, r.package_version)
                      for r in rows if r.uid not in existing]
            if values and self.is_sqlite:
                # the driver's executemany: SQLAlchemy's per-row bind processing costs ~15 us a row,
                # which a program calling train() thousands of times would pay. The timestamp is
                # stored as the same text SQLAlchemy's DateTime writes on SQLite.
                sql = (f"INSERT INTO {Timing.__tablename__} ({', '.join(cols)}) "
                       f"VALUES ({', '.join('?' * len(cols))})")
                conn.exec_driver_sql(sql, [v[:12] + (v[12].isoformat(sep=" ", timespec="microseconds"), v[13])
                                           for v in values])
            elif values:
                conn.execute(Timing.__table__.insert(), [dict(zip(cols, v)) for v in values])
        return len(values)

    def _ensure_device(self, conn, device_id: str, fp: dict):
        if device_id in self._known_devices:
            return
        if conn.execute(select(Device.id).where(Device.id == device_id)).first() is None:
            cores = fp.get("threads", fp.get("cores", fp.get("sms", fp.get("multiprocessors", 0))))
            isa = fp.get("isa", fp.get("compute_capability", fp.get("cc", "")))
            conn.execute(Device.__table__.insert().values(
                id=device_id, backend=str(fp.get("backend", "")),
                model=str(fp.get("model", fp.get("device", fp.get("name", ""))))[:256],
                isa=(",".join(map(str, isa)) if isinstance(isa, (list, tuple)) else str(isa))[:512],
                cores=int(cores) if str(cores).isdigit() else 0,
                driver=str(fp.get("driver", fp.get("cuda_driver", "")))[:256],
                compiler=str(fp.get("compiler", fp.get("nvcc", "")))[:512],
                fingerprint=canonical_json(fp), created_at=_now()))
        self._known_devices.add(device_id)

    def _variant_id(self, conn, key: VariantKey) -> int:
        vid = self._variant_ids.get(key)
        if vid is None:
            q = select(Variant.id).where(Variant.backend == key.backend, Variant.name == key.name,
                                         Variant.tunables == key.tunables,
                                         Variant.source_sha256 == key.source_sha256)
            vid = conn.execute(q).scalar()
            if vid is None:
                vid = conn.execute(Variant.__table__.insert().values(
                    backend=key.backend, name=key.name, tunables=key.tunables,
                    source_sha256=key.source_sha256)).inserted_primary_key[0]
            self._variant_ids[key] = vid
        return vid

    # ------------------------------------------------------------------ reading
    def rows(self, device_id: str | None = None, since_id: int = 0, limit: int | None = None,
             newest_first: bool = False) -> list:
        """Stored rows (queued ones are flushed first), optionally of one device."""
        self.flush()
        return self._run(lambda: self._select(device_id, since_id, limit, newest_first), "read")

    def _select(self, device_id, since_id, limit=None, newest_first=False, extra=None):
        T, V = Timing.__table__.c, Variant.__table__.c
        q = (select(T.id, T.uid, T.device_id, V.backend, V.name, V.tunables, V.source_sha256, T.N, T.D, T.M,
                    T.cvtype, T.dtype, T.status, T.seconds, T.cov_seconds, T.repeats, T.created_at,
                    T.package_version)
             .join_from(Timing.__table__, Variant.__table__, T.variant_id == V.id)
             .where(T.id > since_id))
        if device_id is not None:
            q = q.where(T.device_id == device_id)
        if extra is not None:
            q = q.where(extra)
        q = q.order_by(T.id.desc() if newest_first else T.id)
        if limit is not None:
            q = q.limit(limit)
        keys: dict = {}
        with self._engine.connect() as conn:
            out = []
            for (id_, uid, dev, vb, vn, vt, vs, N, D, M, cv, dt, st, sec, csec, rep, at, pv) in conn.execute(q):
                k = (vb, vn, vt, vs)
                vk = keys.get(k)
                if vk is None:
                    vk = keys[k] = VariantKey(*k)
                out.append(Row(dev, vk, N, D, M, cv, dt, st, sec, csec, rep, at, pv, uid, id_))
            return out

    def view(self, device_id: str) -> DeviceView:
        """The in-memory rows of ``device_id`` (loaded on first use, refreshed when stale)."""
        v = self._views.get(device_id)
        now = time.monotonic()
        if v is not None and now - v.loaded_at < self.refresh_interval:
            return v
        with self._lock:
            v = self._views.get(device_id)
            if v is None:
                v = self._views[device_id] = DeviceView(device_id)
                for r in self._pending:
                    if r.device_id == device_id:
                        v._add(r)
            if not v.max_id and not v.loaded_at:
                for r in self._run(lambda: self._select(device_id, 0), "read"):
                    v._add(r)
            else:
                self._run(lambda: self._refresh(v), "read")
            v.loaded_at = time.monotonic()
        return v

    def _refresh(self, v: DeviceView) -> None:
        """Add the rows stored since ``v`` was read. Only (id, uid) of the newer rows are read first:
        most are this process's own rows, already in the view, and need not be read back."""
        T = Timing.__table__.c
        with self._engine.connect() as conn:
            new = conn.execute(select(T.id, T.uid).where(T.device_id == v.device_id, T.id > v.max_id)).all()
        if not new:
            return
        missing = [i for i, uid in new if uid not in v.uids]
        for k in range(0, len(missing), 500):
            ids = missing[k:k + 500]
            for r in self._select(v.device_id, min(ids) - 1, extra=T.id.in_(ids)):
                v._add(r)
        v.max_id = max(v.max_id, max(i for i, _ in new))

    def devices(self) -> list:
        """``[(device_id, fingerprint dict, number of rows)]`` of the stored devices."""
        self.flush()

        def q():
            with self._engine.connect() as conn:
                T, Dv = Timing.__table__.c, Device.__table__.c
                counts = {d: n for d, n in conn.execute(select(T.device_id, func.count()).group_by(T.device_id))}
                return [(d, json.loads(fp), counts.get(d, 0))
                        for d, fp in conn.execute(select(Dv.id, Dv.fingerprint).order_by(Dv.created_at, Dv.id))]
        return self._run(q, "read")

    def count(self) -> int:
        self.flush()

        def q():
            with self._engine.connect() as conn:
                return conn.execute(select(func.count()).select_from(Timing)).scalar()
        return self._run(q, "read")

    def clear(self) -> int:
        """Delete every timing, variant and device (the schema stays); return the timings deleted."""
        with self._lock:
            self.flush()

            def tx():
                with self._write() as conn:
                    n = conn.execute(select(func.count()).select_from(Timing)).scalar()
                    conn.execute(delete(Timing))
                    conn.execute(delete(Variant))
                    conn.execute(delete(Device))
                    return n
            n = self._run(tx, "clear")
            self._views.clear()
            self._variant_ids.clear()
            self._known_devices.clear()
            return n

    # ------------------------------------------------------------------ export / import
    def export(self, path) -> int:
        """Write every row to ``path`` as JSON (with the schema version); return how many."""
        rows = self.rows()
        devices = {d: fp for d, fp, _ in self.devices()}
        doc = {"format": EXPORT_FORMAT, "schema_version": SCHEMA_VERSION, "exported_at": _now().isoformat(),
               "devices": [{"id": d, "fingerprint": fp} for d, fp in devices.items()],
               "timings": [_row_to_json(r) for r in rows]}
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        return len(rows)

    def import_(self, path) -> tuple:
        """Add the rows of an export file; rows already present (same uid) are skipped.

        Returns ``(added, skipped)``. Raises :class:`SchemaMismatchError` for a file of another
        schema version and :class:`HistoryError` for a file that is not an export.
        """
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise HistoryError(f"cannot read {path} as an asp_gmm history export: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise HistoryError(f"{path} is not an asp_gmm history export (written by `asp-gmm history export`)")
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise SchemaMismatchError(
                f"{path} has schema version {doc.get('schema_version')}, this asp_gmm uses {SCHEMA_VERSION}; "
                "its rows were not imported. Export it again with an asp_gmm of this schema version.")
        try:
            devices = {d["id"]: d["fingerprint"] for d in doc.get("devices", [])}
            rows = [_row_from_json(t) for t in doc.get("timings", [])]
        except (KeyError, TypeError, ValueError) as exc:
            raise HistoryError(f"{path} is a damaged history export ({exc!r}); nothing was imported") from None
        unknown = {r.device_id for r in rows} - set(devices)
        if unknown:
            raise HistoryError(f"{path} has timings of devices it does not describe: {sorted(unknown)[:3]}")
        with self._lock:
            self.flush()
            added = self._run(lambda: self._insert(rows, skip_existing=True, devices=devices), "import into")
            self._views.clear()
        return added, len(rows) - added

    def close(self) -> None:
        """Flush and release the connections."""
        self.flush()
        self._engine.dispose()
        _open_histories.discard(self)


class _WriteTx:
    def __init__(self, engine):
        self.engine = engine

    def __enter__(self):
        self.conn = self.engine.connect().execution_options(asp_gmm_write=True)
        self.tx = self.conn.begin()
        return self.conn

    def __exit__(self, et, ev, tb):
        try:
            if et is None:
                self.tx.commit()
            else:
                self.tx.rollback()
        finally:
            self.conn.close()
        return False


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _row_to_json(r: Row) -> dict:
    d = asdict(r)
    d.pop("id")
    d["variant"] = asdict(r.variant)
    d["created_at"] = r.created_at.isoformat()
    return d


def _row_from_json(d: dict) -> Row:
    v = d["variant"]
    if d["status"] not in STATUSES:
        raise ValueError(f"unknown status {d['status']!r}")
    return Row(device_id=d["device_id"], variant=VariantKey(v["backend"], v["name"], v.get("tunables", "{}"),
                                                            v.get("source_sha256", "")),
               N=int(d["N"]), D=int(d["D"]), M=int(d["M"]), cvtype=d["cvtype"], dtype=d["dtype"],
               status=d["status"], seconds=d.get("seconds"), cov_seconds=d.get("cov_seconds"),
               repeats=int(d.get("repeats", 1)), created_at=datetime.fromisoformat(d["created_at"]),
               package_version=d.get("package_version", ""), uid=d["uid"])
