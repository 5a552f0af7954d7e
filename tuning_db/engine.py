"""Opening a history: the engine, the checks on an SQLite file, error translation, transactions."""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import sys
import time
import urllib.parse
import weakref
from pathlib import Path

from . import lite
from .errors import HistoryError, SchemaMismatchError
from .forksafe import GATE, dispose, dispose_quietly
from .schema import SCHEMA_TABLE, SCHEMA_VERSION
from .values import _now

# SQLAlchemy is imported where the engine is made or used, not with this module: a process that
# reads a plain SQLite history before its first plan reads it through tuning_db.lite alone.


class _Engine:
    """Opening and transactions of :class:`~.store.History` (a part of it)."""

    # ------------------------------------------------------------------ opening
    @property
    def _engine(self):
        """The SQLAlchemy engine, made (and the file checked, created or migrated) on first use."""
        engine = self._engine_obj
        if engine is None:
            with self._engine_lock:
                if self._engine_obj is None:
                    self._make_engine_now()
                engine = self._engine_obj
        return engine

    def _make_engine_now(self) -> None:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            u = make_url(self.url)
        except ArgumentError as exc:
            raise HistoryError(
                f"ASP_GMM_DB={self.url!r} is not a database URL ({exc}); use e.g. "
                "sqlite:///path/history.sqlite or postgresql+psycopg://user@host/db"
            ) from None
        self.is_sqlite = u.get_backend_name() == "sqlite"
        if self._lite_path is None:
            self.path = u.database if self.is_sqlite else None
            self.where = self.path if self.is_sqlite else u.render_as_string(hide_password=True)
        engine = self._make_engine(u)
        self._engine_obj = engine
        # the connections are closed inside the fork gate when this history is collected
        weakref.finalize(self, dispose_quietly, engine).atexit = False
        try:
            self._open()
        except BaseException:
            self._engine_obj = None
            raise

    def _make_engine(self, u):
        from sqlalchemy import create_engine, event

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
        try:
            with GATE.inside():
                con = lite.connect_readonly(self.path, timeout=30.0)
                try:
                    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
                finally:
                    con.close()
        except sqlite3.DatabaseError as exc:
            raise self._translate(exc, "open") from None
        if tables and SCHEMA_TABLE not in tables:
            raise HistoryError(
                f"{self.where} is a database but not an asp_gmm tuning history (it has the tables "
                f"{sorted(tables)[:5]} and no {SCHEMA_TABLE}); it was left unchanged; "
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
        from sqlalchemy import inspect, select

        from .migrations import migrate_1_to_2, migrate_2_to_3
        from .models import Base, SchemaInfo

        def create_or_check():
            with self._write() as conn:
                tables = set(inspect(conn).get_table_names())
                if SCHEMA_TABLE not in tables:
                    if tables:
                        raise HistoryError(
                            f"{self.where} is a database but not an asp_gmm tuning history (it has the "
                            f"tables {sorted(tables)[:5]} and no {SCHEMA_TABLE}); {self._fix()}"
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
            dispose(self._engine_obj)
            raise
        if version != SCHEMA_VERSION:
            dispose(self._engine_obj)
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
                with GATE.inside():  # no fork while SQLite runs on this thread (tuning_db/forksafe.py)
                    return fn()
            except Exception as exc:
                kind = _database_error(exc)
                if kind is None:
                    raise
                # a rolled-back transaction may have inserted ids we cached: forget them
                self._variant_ids.clear()
                self._known_devices.clear()
                msg = str(getattr(exc, "orig", None) or exc).lower()
                transient = (kind == "operational" and ("locked" in msg or "busy" in msg)) or (
                    kind == "integrity" and attempt < 2
                )
                if transient and attempt < 11:
                    time.sleep(delay * (1 + random.random()))
                    delay = min(2 * delay, 1.0)
                    continue
                raise self._translate(exc, doing) from None


def _database_error(exc) -> str | None:
    """``"operational"``, ``"integrity"`` or ``"other"`` for an error of the database (through
    SQLAlchemy or, for tuning_db.lite's reads and writes, the sqlite3 module), ``None`` for any other
    error."""
    if isinstance(exc, sqlite3.Error):
        base = sqlite3
    else:
        sa_exc = sys.modules.get("sqlalchemy.exc")  # loaded if SQLAlchemy raised it
        if sa_exc is None or not isinstance(exc, sa_exc.DatabaseError):
            return None
        base = sa_exc
    if isinstance(exc, base.OperationalError):
        return "operational"
    if isinstance(exc, base.IntegrityError):
        return "integrity"
    return "other"


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
