"""The store: open a history, record timings, read them back, export and import them.

It takes plain values only (a device id and fingerprint dict, a :class:`VariantKey`, problem sizes)
and imports nothing of the backends or the public API.

Writing
    :meth:`History.record` queues a row in memory and makes it visible to :meth:`History.view` at
    once; rows reach the database in batches: when the queue holds ``batch_rows`` rows, when the
    last write is more than ``flush_interval`` seconds old (checked on every record and by the
    selector on every plan), on :meth:`History.flush`, and at interpreter exit (an ``atexit`` hook
    registered when the first history opens). One
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
import math
import os
import random
import sqlite3
import stat
import threading
import time
import urllib.parse
import uuid
import warnings
import weakref
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import platformdirs
from sqlalchemy import String, create_engine, delete, event, func, inspect, select, type_coerce
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, IntegrityError, OperationalError

from .devices import device_id as _device_id
from .devices import device_of
from .errors import HistoryError, SchemaMismatchError
from .models import CVTYPES, DTYPES, INT_MAX, SCHEMA_VERSION, STATUSES, Base, Device, SchemaInfo, Timing, Variant

log = logging.getLogger("asp_gmm.tuning_db")

EXPORT_FORMAT = "asp_gmm-history"
#: Ok timings kept per (device, configuration, problem class, sampled or not); see :class:`History`.
KEEP_PER_CLASS = 16


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


class _OpenHistories:
    """The histories open in this process, flushed at interpreter exit and reset in a forked child.

    One instance is made when the first :class:`History` opens (:func:`_registry`); only then are
    the exit and fork hooks registered, so importing this module has no side effect.
    """

    def __init__(self):
        self.histories: "weakref.WeakSet[History]" = weakref.WeakSet()
        atexit.register(self.flush_all_at_exit)
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self.after_fork_in_child)

    def flush_all_at_exit(self):  # pragma: no cover - exercised by the subprocess tests
        for h in list(self.histories):
            try:
                h.flush()
            except Exception as exc:  # noqa: BLE001 - never raise at exit; say what was lost
                log.warning("asp_gmm: could not save %d timing(s) to %s at exit: %s", len(h._pending), h.where, exc)

    def after_fork_in_child(self):  # pragma: no cover - exercised by multiprocessing users
        for h in list(self.histories):
            h._pending.clear()  # the parent writes its own queue
            h._engine.dispose(close=False)  # never share the parent's connections
            h._lock = threading.RLock()
            h._qlock = threading.Lock()
            if h._writer is not None:
                h._writer.after_fork_in_child()


_registry_instance: _OpenHistories | None = None
_registry_lock = threading.Lock()


def _registry() -> _OpenHistories:
    """The process's :class:`_OpenHistories`, made (and its hooks registered) on first use."""
    global _registry_instance
    if _registry_instance is None:
        with _registry_lock:
            if _registry_instance is None:
                _registry_instance = _OpenHistories()
    return _registry_instance


class History:
    """A tuning history at ``url`` (default :func:`default_url`).

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL (``sqlite:///path``, ``postgresql+psycopg://user@host/db``...) or a file path.
    package_version : str
        Stored with every row.
    keep_per_class : int
        Ok timings kept per (device, configuration, cvtype, dtype, D, M, problem class, sampled or
        not): a new one replaces the oldest beyond that (:data:`KEEP_PER_CLASS`; 0 keeps all), so
        a program that trains on thousands of sizes does not grow the file (and the read at start)
        without bound. ``asp-gmm tune`` and imports keep everything they write.
    batch_rows, flush_interval : int, float
        Write policy (see the module documentation).
    refresh_interval : float
        How stale an in-memory :meth:`view` may get before rows written by other processes are read.
    background : bool
        Write the batches on a thread of the history's own (:mod:`tuning_db.writer`), so that
        :meth:`record` never waits for a commit; the package's shared history is opened so.

    Raises
    ------
    HistoryError
        The database cannot be opened, is corrupt, is not an asp_gmm history, or has another schema
        version; the message names it and says what to do.
    """

    def __init__(
        self,
        url: str | None = None,
        package_version: str = "",
        batch_rows: int = 256,
        flush_interval: float = 1.0,
        refresh_interval: float = 5.0,
        keep_per_class: int = KEEP_PER_CLASS,
        background: bool = False,
    ):
        self.url = url or default_url()
        self.keep_per_class = keep_per_class
        if "://" not in self.url:
            self.url = "sqlite:///" + str(Path(self.url).expanduser().absolute())
        self.package_version = package_version
        self.batch_rows, self.flush_interval, self.refresh_interval = batch_rows, flush_interval, refresh_interval
        self._lock = threading.RLock()  # the database and the caches of ids
        self._qlock = threading.Lock()  # the queue alone: record() never waits for a write
        self._writer = None
        self._pending: list = []
        self._last_flush = time.monotonic()  # a batch starts when the history is opened
        self._views: dict = {}
        self._variant_ids: dict = {}
        self._known_devices: set = set()
        self._fingerprints: dict = {}
        self._warned_damaged: set = set()
        try:
            u = make_url(self.url)
        except ArgumentError as exc:
            raise HistoryError(
                f"ASP_GMM_DB={self.url!r} is not a database URL ({exc}); use e.g. "
                "sqlite:///path/history.sqlite or postgresql+psycopg://user@host/db"
            ) from None
        self.is_sqlite = u.get_backend_name() == "sqlite"
        self.path = u.database if self.is_sqlite else None
        self.where = self.path if self.is_sqlite else u.render_as_string(hide_password=True)
        self._engine = self._make_engine(u)
        self._open()
        if background:
            from .writer import Writer

            self._writer = Writer(self)
        _registry().histories.add(self)

    # ------------------------------------------------------------------ opening
    def _make_engine(self, u):
        if not self.is_sqlite:
            try:
                return create_engine(u, pool_pre_ping=True)
            except ImportError as exc:
                raise HistoryError(
                    f"the database driver for {self.where} is not installed ({exc}); "
                    "install it (e.g. pip install 'psycopg[binary]') or unset ASP_GMM_DB"
                ) from None
        if self.path in (None, "", ":memory:"):
            raise HistoryError(
                "an in-memory SQLite history would be lost at exit and is not shared between "
                "connections; give a file: sqlite:///path/history.sqlite"
            )
        if str(u.query.get("uri", "")).lower() in ("true", "1") and self.path.startswith("file:"):
            self.path = self.where = urllib.parse.unquote(urllib.parse.urlparse(self.path).path)
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HistoryError(
                f"the folder of the tuning history {self.path} cannot be created ({exc.strerror or exc}); set "
                "ASP_GMM_DB to a file in a folder you can write (or any SQLAlchemy URL)"
            ) from None
        self._check_sqlite_file()
        engine = create_engine(u, connect_args={"timeout": 30.0})

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (below)
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("asp_gmm_write") else "BEGIN")

        return engine

    def _check_sqlite_file(self) -> None:
        """Refuse, before any connection that could write (``journal_mode=WAL`` rewrites the header),
        a file that is not an SQLite database or is another program's database: such a file is left
        byte for byte as it was. An empty or missing file, or one with no tables, becomes a history."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise HistoryError(
                f"the tuning history {self.path} cannot be read ({exc.strerror or exc}); "
                "set ASP_GMM_DB to a file you can read and write"
            ) from None
        if stat.S_ISDIR(st.st_mode):
            raise HistoryError(
                f"the tuning history {self.path} is a folder; set ASP_GMM_DB to a file path, "
                f"e.g. {Path(self.path) / 'history.sqlite'}"
            )
        if st.st_size == 0:
            return
        uri = "file:" + urllib.parse.quote(str(Path(self.path).absolute())) + "?mode=ro"
        try:
            con = sqlite3.connect(uri, uri=True, timeout=30.0)
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            finally:
                con.close()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc, "open") from None
        if tables and SchemaInfo.__tablename__ not in tables:
            raise HistoryError(
                f"{self.where} is a database but not an asp_gmm tuning history (it has the tables "
                f"{sorted(tables)[:5]} and no {SchemaInfo.__tablename__}); it was left unchanged; "
                "set ASP_GMM_DB to another location"
            )

    def _fix(self) -> str:
        if self.is_sqlite:
            return f"move {self.path} away (or delete it to start a new history), or set ASP_GMM_DB to another location"
        return "check the server and the URL in ASP_GMM_DB, or unset ASP_GMM_DB to use the local SQLite file"

    def _translate(self, exc: Exception, doing: str) -> HistoryError:
        msg = str(getattr(exc, "orig", None) or exc)
        low = msg.lower()
        if self.is_sqlite and ("not a database" in low or "malformed" in low or "encrypted" in low):
            return HistoryError(
                f"the tuning history {self.path} is corrupt or not an SQLite file ({msg}); {self._fix()}"
            )
        if self.is_sqlite and ("readonly" in low or "read-only" in low or "permission denied" in low):
            # never advise deleting it: it may be a shared history someone made read-only on purpose
            return HistoryError(
                f"could not {doing} the tuning history {self.path}: it is read-only for you ({msg}). Make it and "
                "its folder writable for you (chmod u+w), or set ASP_GMM_DB to a file you can write, or set "
                "ASP_GMM_AUTOTUNE=0 to run without measuring"
            )
        if self.is_sqlite and "unable to open" in low:
            return HistoryError(
                f"could not {doing} the tuning history {self.path} ({msg}): check that you can read and write "
                "it and its folder, or set ASP_GMM_DB to another location"
            )
        return HistoryError(f"could not {doing} the tuning history {self.where}: {msg}; {self._fix()}")

    def _open(self):
        def create_or_check():
            with self._write() as conn:
                tables = set(inspect(conn).get_table_names())
                if SchemaInfo.__tablename__ not in tables:
                    if tables:
                        raise HistoryError(
                            f"{self.where} is a database but not an asp_gmm tuning history (it has the "
                            f"tables {sorted(tables)[:5]} and no {SchemaInfo.__tablename__}); {self._fix()}"
                        )
                    Base.metadata.create_all(conn)
                    conn.execute(
                        SchemaInfo.__table__.insert().values(
                            id=1,
                            version=SCHEMA_VERSION,
                            created_by=f"asp_gmm {self.package_version}".strip(),
                            created_at=_now(),
                        )
                    )
                version = conn.execute(select(SchemaInfo.version).where(SchemaInfo.id == 1)).scalar()
                if version == 1:
                    migrate_1_to_2(conn)
                    version = 2
                if version == 2:
                    migrate_2_to_3(conn)
                    version = 3
                return version

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
                f"{SCHEMA_VERSION}; export what you need with the asp_gmm that wrote it, then {self._fix()}"
            )

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
                    isinstance(exc, IntegrityError) and attempt < 2
                )
                if transient and attempt < 11:
                    time.sleep(delay * (1 + random.random()))
                    delay = min(2 * delay, 1.0)
                    continue
                raise self._translate(exc, doing) from None

    # ------------------------------------------------------------------ writing
    def record(
        self,
        device_id: str,
        fingerprint: dict,
        variant: VariantKey,
        N: int,
        D: int,
        M: int,
        cvtype: str,
        dtype: str,
        status: str,
        seconds: float | None = None,
        cov_seconds: float | None = None,
        repeats: int = 1,
        threads: int | None = None,
        sampled_from: int | None = None,
    ) -> Row:
        """Queue one timing (``status="ok"``) or failure; it is visible to :meth:`view` at once.

        ``threads``: the CPU threads the run used (a property of the run, not of the device).
        ``sampled_from``: the timing ran on a sample (``N`` events) of a call of this many events."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        if status == "ok" and (seconds is None or not seconds > 0):
            raise ValueError(f"an ok timing needs seconds > 0, got {seconds!r}")
        row = Row(
            device_id,
            variant,
            int(N),
            int(D),
            int(M),
            cvtype,
            dtype,
            status,
            None if seconds is None else float(seconds),
            None if cov_seconds is None else float(cov_seconds),
            int(repeats),
            package_version=self.package_version,
            threads=None if threads is None else int(threads),
            sampled_from=None if sampled_from is None else int(sampled_from),
        )
        with self._qlock:
            if device_id not in self._fingerprints:
                self._fingerprints[device_id] = dict(fingerprint)
            self._pending.append(row)
            view = self._views.get(device_id)
            if view is not None:
                view._add(row)
            due = len(self._pending) >= self.batch_rows or time.monotonic() - self._last_flush >= self.flush_interval
        if due:
            self._flush_soon()
        return row

    def maybe_flush(self) -> None:
        """Flush when rows are queued and the last write is older than ``flush_interval`` (with
        ``background``, on the writer's thread; its last error, if any, is raised here)."""
        if self._writer is not None:
            self._writer.raise_pending()
        if self._pending and time.monotonic() - self._last_flush >= self.flush_interval:
            self._flush_soon()

    def _flush_soon(self) -> None:
        if self._writer is None:
            self.flush()
        else:
            self._writer.raise_pending()
            self._writer.request()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def flush(self) -> int:
        """Write the queued rows in one transaction; return how many."""
        with self._lock:  # one writer at a time (the writer's thread, exit, explicit calls)
            with self._qlock:
                rows = list(self._pending)
            if not rows:
                self._last_flush = time.monotonic()
                return 0
            self._run(lambda: self._insert(rows, skip_existing=False, bound=True), "write to")
            with self._qlock:  # rows queued meanwhile stay (only flushes remove from the front)
                del self._pending[: len(rows)]
            self._last_flush = time.monotonic()
            return len(rows)

    def _insert(self, rows, skip_existing: bool, devices: dict | None = None, bound: bool = False) -> int:
        with self._write() as conn:
            if bound:
                rows = self._bound(conn, rows)
            fps = dict(self._fingerprints)
            fps.update(devices or {})
            for dev in {r.device_id for r in rows}:
                self._ensure_device(conn, dev, fps.get(dev, {}))
            existing = set()
            if skip_existing:
                uids = [r.uid for r in rows]
                for i in range(0, len(uids), 500):
                    existing.update(conn.execute(select(Timing.uid).where(Timing.uid.in_(uids[i : i + 500]))).scalars())
            cols = (
                "uid",
                "device_id",
                "variant_id",
                "N",
                "D",
                "M",
                "cvtype",
                "dtype",
                "seconds",
                "cov_seconds",
                "repeats",
                "status",
                "created_at",
                "package_version",
                "threads",
                "sampled_from",
            )
            values = [
                (
                    r.uid,
                    r.device_id,
                    self._variant_id(conn, r.variant),
                    r.N,
                    r.D,
                    r.M,
                    r.cvtype,
                    r.dtype,
                    r.seconds,
                    r.cov_seconds,
                    r.repeats,
                    r.status,
                    r.created_at,
                    r.package_version,
                    r.threads,
                    r.sampled_from,
                )
                for r in rows
                if r.uid not in existing
            ]
            if values and self.is_sqlite:
                # the driver's executemany: SQLAlchemy's per-row bind processing costs ~15 us a row,
                # which a program calling train() thousands of times would pay. The timestamp is
                # stored as the same text SQLAlchemy's DateTime writes on SQLite.
                sql = f"INSERT INTO {Timing.__tablename__} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
                conn.exec_driver_sql(
                    sql, [v[:12] + (v[12].isoformat(sep=" ", timespec="microseconds"),) + v[13:] for v in values]
                )
            elif values:
                conn.execute(Timing.__table__.insert(), [dict(zip(cols, v)) for v in values])
        return len(values)

    def _bound(self, conn, rows) -> list:
        """Keep the history's growth bounded: before ``rows`` are inserted, delete the oldest ok
        timings of each (device, configuration, cvtype, dtype, D, M, problem class, sampled or
        not) that ``rows`` add to, so that at most :attr:`keep_per_class` remain with the new ones;
        returns ``rows`` without the oldest ok ones of a class beyond that bound within the batch.
        The problem class is N in half-octaves (``round(2 log2 N)``, of ``sampled_from`` for a
        sampled timing), as selection groups timings; failures are always kept (a few per key)."""
        keep = self.keep_per_class
        if not keep:
            return rows
        T = Timing.__table__.c
        touched: dict = {}
        skip = set()
        for r in reversed(rows):  # newest first: the batch's own oldest beyond the bound are dropped
            if r.status == "ok":
                k = (r.device_id, r.variant, r.cvtype, r.dtype, r.D, r.M)
                cls = (round(2 * math.log2(max(r.sampled_from or r.N, 1))), r.sampled_from is not None)
                touched.setdefault(k, {}).setdefault(cls, 0)
                if touched[k][cls] >= keep:
                    skip.add(r.uid)
                else:
                    touched[k][cls] += 1
        if skip:
            rows = [r for r in rows if r.uid not in skip]
        for (dev, vk, cv, dt, D, M), classes in touched.items():
            vid = self._variant_id(conn, vk)
            q = (
                select(T.id, T.N, T.sampled_from)
                .where(
                    T.device_id == dev,
                    T.cvtype == cv,
                    T.dtype == dt,
                    T.D == D,
                    T.M == M,
                    T.variant_id == vid,
                    T.status == "ok",
                )
                .order_by(T.id.desc())
            )
            seen: dict = {}
            drop = []
            for id_, N, sf in conn.execute(q):
                sf = sf if isinstance(sf, int) and sf > 0 else None
                cls = (round(2 * math.log2(max(sf or N or 1, 1))), sf is not None)
                if cls not in classes:
                    continue
                seen[cls] = seen.get(cls, 0) + 1
                if seen[cls] + classes[cls] > keep:
                    drop.append(id_)
            for i in range(0, len(drop), 500):
                conn.execute(delete(Timing).where(T.id.in_(drop[i : i + 500])))
        return rows

    def _ensure_device(self, conn, device_id: str, fp: dict):
        if device_id in self._known_devices:
            return
        if conn.execute(select(Device.id).where(Device.id == device_id)).first() is None:
            conn.execute(
                Device.__table__.insert().values(
                    id=device_id, **device_of(fp).columns(), fingerprint=canonical_json(fp), created_at=_now()
                )
            )
        self._known_devices.add(device_id)

    def _variant_id(self, conn, key: VariantKey) -> int:
        vid = self._variant_ids.get(key)
        if vid is None:
            q = select(Variant.id).where(
                Variant.backend == key.backend,
                Variant.name == key.name,
                Variant.tunables == key.tunables,
                Variant.source_sha256 == key.source_sha256,
            )
            vid = conn.execute(q).scalar()
            if vid is None:
                vid = conn.execute(
                    Variant.__table__.insert().values(
                        backend=key.backend, name=key.name, tunables=key.tunables, source_sha256=key.source_sha256
                    )
                ).inserted_primary_key[0]
            self._variant_ids[key] = vid
        return vid

    # ------------------------------------------------------------------ reading
    def rows(
        self, device_id: str | None = None, since_id: int = 0, limit: int | None = None, newest_first: bool = False
    ) -> list:
        """Stored rows (queued ones are flushed first), optionally of one device."""
        self.flush()
        return self._run(lambda: self._select(device_id, since_id, limit, newest_first), "read")

    def _select(self, device_id, since_id, limit=None, newest_first=False, extra=None):
        with self._engine.connect() as conn:
            rows, bad = self._read(conn, device_id, since_id, limit, newest_first, extra)
        self._warn_damaged(bad)
        return rows

    def _read(self, conn, device_id, since_id, limit=None, newest_first=False, extra=None):
        """``(rows, damaged)``: the stored rows that can be read, and ``[(id, what is wrong)]`` of
        those that cannot (values no asp_gmm writes; SQLite keeps any value in any column)."""
        T, V = Timing.__table__.c, Variant.__table__.c
        at = type_coerce(T.created_at, String) if self.is_sqlite else T.created_at
        q = (
            select(
                T.id,
                T.uid,
                T.device_id,
                V.backend,
                V.name,
                V.tunables,
                V.source_sha256,
                T.N,
                T.D,
                T.M,
                T.cvtype,
                T.dtype,
                T.status,
                T.seconds,
                T.cov_seconds,
                T.repeats,
                at,
                T.package_version,
                T.threads,
                T.sampled_from,
            )
            .join_from(Timing.__table__, Variant.__table__, T.variant_id == V.id)
            .where(T.id > since_id)
        )
        if device_id is not None:
            q = q.where(T.device_id == device_id)
        if extra is not None:
            q = q.where(extra)
        q = q.order_by(T.id.desc() if newest_first else T.id)
        if limit is not None:
            q = q.limit(limit)
        keys: dict = {}
        out, bad = [], []
        for id_, uid, dev, vb, vn, vt, vs, N, D, M, cv, dt, st, sec, csec, rep, at, pv, thr, sf in conn.execute(q):
            k = (vb, vn, vt, vs)
            vk = keys.get(k)
            try:
                if vk is None:
                    why = _tunables_problem(vt)
                    if why:
                        raise _Bad("variant.tunables", why)
                    vk = keys[k] = VariantKey(*k)
                _check_values(N, D, M, cv, dt, st, sec, csec, rep)
                when = _timestamp(at)
            except _Bad as b:
                bad.append((id_, f"{b.field} {b.why}"))
                continue
            out.append(
                Row(
                    dev,
                    vk,
                    N,
                    D,
                    M,
                    cv,
                    dt,
                    st,
                    sec,
                    csec,
                    rep,
                    when,
                    pv or "",
                    uid,
                    id_,
                    thr if isinstance(thr, int) and not isinstance(thr, bool) else None,
                    sf if isinstance(sf, int) and not isinstance(sf, bool) and sf > 0 else None,
                )
            )
        return out, bad

    def _warn_damaged(self, bad) -> None:
        new = [(i, why) for i, why in bad if i not in self._warned_damaged]
        if not new:
            return
        self._warned_damaged.update(i for i, _ in new)
        shown = "; ".join(f"id {i}: {why}" for i, why in new[:5]) + ("; ..." if len(new) > 5 else "")
        msg = (
            f"asp_gmm: skipped {len(new)} damaged timing row(s) of the tuning history {self.where} ({shown}); "
            "run `asp-gmm history repair` to delete them"
        )
        log.warning(msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=3)

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
                for r in list(self._pending):
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
            ids = missing[k : k + 500]
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
                out, bad = [], []
                for d, fp in conn.execute(select(Dv.id, Dv.fingerprint).order_by(Dv.created_at, Dv.id)):
                    why = _fingerprint_problem(fp)
                    if why:
                        bad.append((d, why))
                    else:
                        out.append((d, json.loads(fp), counts.get(d, 0)))
                return out, bad

        out, bad = self._run(q, "read")
        if bad:
            msg = (
                f"asp_gmm: skipped {len(bad)} device(s) of the tuning history {self.where} whose fingerprint "
                f"cannot be read ({'; '.join(f'{d}: {w}' for d, w in bad[:3])}); run `asp-gmm history repair` "
                "to delete them"
            )
            log.warning(msg)
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
        return out

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
        doc = {
            "format": EXPORT_FORMAT,
            "schema_version": SCHEMA_VERSION,
            "exported_at": _now().isoformat(),
            "devices": [{"id": d, "fingerprint": fp} for d, fp in devices.items()],
            "timings": [_row_to_json(r) for r in rows],
        }
        tmp = Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        return len(rows)

    def import_(self, path) -> tuple:
        """Add the rows of an export file; rows already present (same uid) are skipped.

        Every device and timing is checked first (types, ranges that fit the columns, known statuses,
        cvtypes and dtypes, tunables that are JSON objects, timestamps); one bad value rejects the
        whole file and nothing is written. The rows are then written in one transaction.

        Returns ``(added, skipped)``. Raises :class:`SchemaMismatchError` for a file of another
        schema version and :class:`HistoryError` for a file that is not an export or holds a bad
        value (the message names the row and the field).
        """
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            raise HistoryError(f"cannot read {path} as an asp_gmm history export: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise HistoryError(f"{path} is not an asp_gmm history export (written by `asp-gmm history export`)")
        if doc.get("schema_version") == 1 and isinstance(doc.get("devices"), list):
            doc = _export_from_1(doc)
        if doc.get("schema_version") == 2:
            doc = {**doc, "schema_version": 3}  # schema 3 only adds timings' optional sampled_from
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise SchemaMismatchError(
                f"{path} has schema version {doc.get('schema_version')}, this asp_gmm uses {SCHEMA_VERSION}; "
                "its rows were not imported. Export it again with an asp_gmm of this schema version."
            )
        devices, rows = _parse_export(doc, path)
        with self._lock:
            self.flush()
            added = self._run(lambda: self._insert(rows, skip_existing=True, devices=devices), "import into")
            self._views.clear()
        return added, len(rows) - added

    def repair(self) -> int:
        """Delete the damaged rows a history may hold (values no asp_gmm writes: written by an older
        import or by hand), which reading skips with a warning: timings that cannot be read, and
        variants and devices that cannot be read with their timings. Returns the timings deleted."""
        with self._lock:
            self.flush()

            def tx():
                with self._write() as conn:
                    _, bad = self._read(conn, None, 0)
                    bad_ids = {i for i, _ in bad}
                    V, Dv, T = Variant.__table__.c, Device.__table__.c, Timing.__table__.c
                    bad_variants = [
                        vid for vid, tun in conn.execute(select(V.id, V.tunables)) if _tunables_problem(tun)
                    ]
                    bad_devices = [
                        did for did, fp in conn.execute(select(Dv.id, Dv.fingerprint)) if _fingerprint_problem(fp)
                    ]
                    n = 0
                    for col, keys in (
                        (T.variant_id, bad_variants),
                        (T.device_id, bad_devices),
                        (T.id, sorted(bad_ids)),
                    ):
                        for k in range(0, len(keys), 500):
                            n += conn.execute(delete(Timing).where(col.in_(keys[k : k + 500]))).rowcount
                    for k in range(0, len(bad_variants), 500):
                        conn.execute(delete(Variant).where(V.id.in_(bad_variants[k : k + 500])))
                    for k in range(0, len(bad_devices), 500):
                        conn.execute(delete(Device).where(Dv.id.in_(bad_devices[k : k + 500])))
                    return n

            n = self._run(tx, "repair")
            self._views.clear()
            self._variant_ids.clear()
            self._known_devices.clear()
            self._warned_damaged.clear()
            return n

    def close(self) -> None:
        """Flush and release the connections."""
        self.flush()
        self._engine.dispose()
        _registry().histories.discard(self)


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


def _check_values(N, D, M, cvtype, dtype, status, seconds, cov_seconds, repeats) -> None:
    """Raise :class:`_Bad` for a timing's values that no asp_gmm writes."""
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
def merge_cpu_devices(devices: dict) -> tuple:
    """Schema 1 -> 2 for fingerprints: one CPU is one device.

    Schema 1 put the threads setting in force into a CPU's fingerprint, so one CPU appeared as one
    device per thread count. The devices whose fingerprints differ only in ``threads`` become one
    device whose ``threads`` is the largest count seen (the best known bound of its hardware threads);
    the old count moves to each timing (``timings.threads``).

    Parameters
    ----------
    devices : dict
        ``{device_id: fingerprint dict}``.

    Returns
    -------
    new_devices : dict
        ``{device_id: fingerprint dict}`` after merging (other devices unchanged).
    moves : dict
        ``{old_id: (new_id, old threads)}`` of each CPU device that was renamed or merged.
    """
    groups: dict = {}
    for did, fp in devices.items():
        if isinstance(fp, dict) and fp.get("backend") == "c" and isinstance(fp.get("threads"), int):
            rest = canonical_json({k: v for k, v in fp.items() if k != "threads"})
            groups.setdefault(rest, []).append(did)
    new_devices, moves = dict(devices), {}
    for ids in groups.values():
        fp = dict(devices[ids[0]])
        fp["threads"] = max(devices[i]["threads"] for i in ids)
        new_id = _device_id(fp)
        for i in ids:
            new_devices.pop(i, None)
            if i != new_id:
                moves[i] = (new_id, devices[i]["threads"])
            else:
                moves[i] = (i, devices[i]["threads"])
        new_devices[new_id] = fp
    return new_devices, moves


def migrate_1_to_2(conn) -> None:
    """Upgrade a schema-1 history in place (inside the caller's write transaction), keeping every row:
    add ``timings.threads``, merge one CPU's devices (:func:`merge_cpu_devices`), and rewrite every
    device's columns from its typed fingerprint (a CUDA device had ``cores = 0`` and ``isa = ""``)."""
    T, Dv = Timing.__table__, Device.__table__
    conn.exec_driver_sql(f"ALTER TABLE {T.name} ADD COLUMN threads INTEGER")
    old = {}
    for did, text, created in conn.execute(select(Dv.c.id, Dv.c.fingerprint, Dv.c.created_at)):
        try:
            old[did] = (json.loads(text), created)
        except (TypeError, ValueError):
            continue  # unreadable: left for `asp-gmm history repair`
    new_devices, moves = merge_cpu_devices({d: fp for d, (fp, _) in old.items()})
    for old_id, (new_id, threads) in moves.items():
        if conn.execute(select(Dv.c.id).where(Dv.c.id == new_id)).first() is None:
            conn.execute(
                Dv.insert().values(
                    id=new_id,
                    **device_of(new_devices[new_id]).columns(),
                    fingerprint=canonical_json(new_devices[new_id]),
                    created_at=old[old_id][1] or _now(),
                )
            )
        conn.execute(T.update().where(T.c.device_id == old_id).values(device_id=new_id, threads=threads))
        if old_id != new_id:
            conn.execute(delete(Device).where(Dv.c.id == old_id))
    for did, fp in new_devices.items():
        if isinstance(fp, dict):
            conn.execute(
                Dv.update().where(Dv.c.id == did).values(**device_of(fp).columns(), fingerprint=canonical_json(fp))
            )
    conn.execute(SchemaInfo.__table__.update().where(SchemaInfo.__table__.c.id == 1).values(version=2))


def migrate_2_to_3(conn) -> None:
    """Upgrade a schema-2 history in place: add ``timings.sampled_from`` (every older timing ran on
    the whole data, so it stays NULL)."""
    T = Timing.__table__
    conn.exec_driver_sql(f"ALTER TABLE {T.name} ADD COLUMN sampled_from INTEGER")
    conn.execute(SchemaInfo.__table__.update().where(SchemaInfo.__table__.c.id == 1).values(version=3))


def _export_from_1(doc: dict) -> dict:
    """A schema-1 export document read as schema 2 (the same merge as :func:`migrate_1_to_2`)."""
    devs = {d.get("id"): d.get("fingerprint") for d in doc["devices"] if isinstance(d, dict)}
    new_devices, moves = merge_cpu_devices(devs)
    timings = []
    for t in doc.get("timings", []) if isinstance(doc.get("timings"), list) else []:
        if isinstance(t, dict) and t.get("device_id") in moves:
            new_id, threads = moves[t["device_id"]]
            t = {**t, "device_id": new_id, "threads": threads}
        timings.append(t)
    return {
        **doc,
        "schema_version": 2,
        "devices": [{"id": d, "fingerprint": fp} for d, fp in new_devices.items()],
        "timings": timings,
    }
