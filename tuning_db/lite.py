"""Reading and writing the timings of an SQLite history with the standard library's ``sqlite3`` alone.

Every process that trains opens the history and reads its device's rows before its first plan.
Through SQLAlchemy that costs the import of SQLAlchemy (~0.15 s on a 2-core machine) and its row
processing (~0.04 s for 10 000 rows) before the first ``train`` can choose; the rows themselves are
plain columns. So for an SQLite file that already is a history of this schema version,
:class:`~tuning_db.store.History` reads through this module and builds its SQLAlchemy engine only
when it first writes (on its writer's thread, or at exit) or does anything else (export, repair,
migrations, a new file). The SQL here reads the same columns as :meth:`tuning_db.reads._Reads._read`
and its rows pass the same checks; a test compares both readings of one file.

The writes of timings (:meth:`tuning_db.writes._Writes._insert`: devices, variants, timings and the
bound per class) run here too, through :class:`LiteOps`, so that a process that trains and records
never loads SQLAlchemy either; creating, migrating, exporting, importing, repairing and clearing
go through the engine. Connections are opened per read or write transaction (a few hundred
microseconds); no journal mode is set here (the file's WAL mode is persistent).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import urllib.parse
from contextlib import contextmanager
from pathlib import Path

from .schema import DEVICES_TABLE, SCHEMA_TABLE, TIMINGS_TABLE, VARIANTS_TABLE

#: the columns of a timing row, in the order :meth:`tuning_db.reads._Reads._rows` takes them
_COLUMNS = (
    "t.id, t.uid, t.device_id, v.backend, v.name, v.tunables, v.source_sha256, t.N, t.D, t.M, "
    "t.cvtype, t.dtype, t.status, t.seconds, t.cov_seconds, t.repeats, t.created_at, "
    "t.package_version, t.threads, t.sampled_from"
)
#: ids per ``IN (...)`` list (SQLite's default limit on bound parameters is far above)
ID_CHUNK = 500


def plain_path(url: str) -> str | None:
    """The file of a plain ``sqlite:///path`` URL (as :func:`tuning_db.values.default_url` makes),
    or ``None`` for any other URL (a query string, another database, ``:memory:``), which SQLAlchemy
    parses."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or any(c in url for c in "?#"):
        return None
    path = url[len(prefix) :]
    if not path or path == ":memory:":
        return None
    return path


def schema_version(path: str) -> int | None:
    """The schema version stored in the SQLite file ``path``, or ``None`` where it cannot be read
    here: missing, empty, not a regular file, not an SQLite database, no schema table (a new or a
    foreign database), unreadable, locked. ``None`` sends the caller the full way (the engine),
    which creates, migrates or refuses the file with its own messages."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    try:
        con = connect_readonly(path, timeout=5.0)
        try:
            row = con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (SCHEMA_TABLE,))
            if row.fetchone() is None:
                return None
            got = con.execute(f"SELECT version FROM {SCHEMA_TABLE} WHERE id = 1").fetchone()
        finally:
            con.close()
    except sqlite3.Error:
        return None
    return got[0] if got and isinstance(got[0], int) else None


def connect_readonly(path: str, timeout: float) -> sqlite3.Connection:
    """A connection that cannot write the file (``mode=ro``): nothing rewrites the header of a file
    that may not be a history at all."""
    uri = "file:" + urllib.parse.quote(str(Path(path).absolute())) + "?mode=ro"
    return sqlite3.connect(uri, uri=True, timeout=timeout)


def connect(path: str) -> sqlite3.Connection:
    """A connection for reading (the same busy timeout as the engine's: a writer holding the file
    makes a reader wait, not fail)."""
    con = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA busy_timeout=30000")
    return con


def select_rows(path: str, device_id=None, since_id: int = 0, limit=None, newest_first: bool = False, ids=None) -> list:
    """Raw timing tuples (columns as :data:`_COLUMNS`) with ``id > since_id``, of ``device_id``
    when given, of ``ids`` when given, ordered by id."""
    sql = [
        f"SELECT {_COLUMNS} FROM {TIMINGS_TABLE} AS t JOIN {VARIANTS_TABLE} AS v ON t.variant_id = v.id",
        "WHERE t.id > ?",
    ]
    args: list = [since_id]
    if device_id is not None:
        sql.append("AND +t.device_id = ?")  # unary +: scan by id (no sort), not by the device index
        args.append(device_id)
    if ids is not None:
        sql.append(f"AND t.id IN ({', '.join('?' * len(ids))})")
        args.extend(ids)
    sql.append("ORDER BY t.id DESC" if newest_first else "ORDER BY t.id")
    if limit is not None:
        sql.append("LIMIT ?")
        args.append(int(limit))
    con = connect(path)
    try:
        return con.execute(" ".join(sql), args).fetchall()
    finally:
        con.close()


def row_uids(path: str, ids) -> dict:
    """``{id: uid}`` of the stored timings among ``ids`` (at most :data:`ID_CHUNK`)."""
    ids = [int(i) for i in ids]
    con = connect(path)
    try:
        got = con.execute(f"SELECT id, uid FROM {TIMINGS_TABLE} WHERE id IN ({', '.join('?' * len(ids))})", ids)
        return dict(got.fetchall())
    finally:
        con.close()


def newer_ids(path: str, device_id: str, max_id: int) -> list:
    """``[(id, uid)]`` of ``device_id``'s timings with ``id > max_id``."""
    con = connect(path)
    try:
        return con.execute(
            f"SELECT id, uid FROM {TIMINGS_TABLE} WHERE device_id = ? AND id > ?", (device_id, max_id)
        ).fetchall()
    finally:
        con.close()


@contextmanager
def write(path: str):
    """:class:`LiteOps` over one write transaction (``BEGIN IMMEDIATE``, as the engine's writes:
    no lock upgrade that could deadlock), committed on leaving, rolled back on an error."""
    con = sqlite3.connect(path, timeout=30.0, isolation_level=None, check_same_thread=False)
    try:
        for pragma in ("busy_timeout=30000", "synchronous=NORMAL", "foreign_keys=ON"):
            con.execute(f"PRAGMA {pragma}")
        con.execute("BEGIN IMMEDIATE")
        try:
            yield LiteOps(con)
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    finally:
        con.close()


def _text_time(t) -> str:
    """A timestamp as SQLAlchemy's ``DateTime`` stores it on SQLite (naive UTC, microseconds), so
    that rows written here and through the engine read back alike."""
    return t.isoformat(sep=" ", timespec="microseconds")


def _marks(values) -> str:
    return ", ".join("?" * len(values))


class LiteOps:
    """The statements of a write (:meth:`tuning_db.writes._Writes._insert`) on an sqlite3
    connection; :class:`tuning_db.sa_ops.SAOps` has the same methods through SQLAlchemy Core."""

    def __init__(self, con: sqlite3.Connection):
        self.con = con

    def device_exists(self, device_id: str) -> bool:
        return self.con.execute(f"SELECT 1 FROM {DEVICES_TABLE} WHERE id = ?", (device_id,)).fetchone() is not None

    def insert_device(self, device_id: str, columns: dict, fingerprint: str, created_at) -> None:
        cols = ["id", *columns, "fingerprint", "created_at"]
        vals = [device_id, *columns.values(), fingerprint, _text_time(created_at)]
        self.con.execute(f"INSERT INTO {DEVICES_TABLE} ({', '.join(cols)}) VALUES ({_marks(vals)})", vals)

    def variant_id(self, backend: str, name: str, tunables: str, sha: str):
        got = self.con.execute(
            f"SELECT id FROM {VARIANTS_TABLE} WHERE backend = ? AND name = ? AND tunables = ? AND source_sha256 = ?",
            (backend, name, tunables, sha),
        ).fetchone()
        return None if got is None else got[0]

    def insert_variant(self, backend: str, name: str, tunables: str, sha: str) -> int:
        cur = self.con.execute(
            f"INSERT INTO {VARIANTS_TABLE} (backend, name, tunables, source_sha256) VALUES (?, ?, ?, ?)",
            (backend, name, tunables, sha),
        )
        return cur.lastrowid

    def ok_timings(self, device_id, variant_id, cvtype, dtype, D, M):
        """``(id, N, sampled_from)`` of the ok timings of one key, newest first."""
        return self.con.execute(
            f"SELECT id, N, sampled_from FROM {TIMINGS_TABLE} WHERE device_id = ? AND cvtype = ? AND dtype = ? "
            "AND D = ? AND M = ? AND variant_id = ? AND status = 'ok' ORDER BY id DESC",
            (device_id, cvtype, dtype, D, M, variant_id),
        ).fetchall()

    def delete_timings(self, ids) -> int:
        return self.con.execute(f"DELETE FROM {TIMINGS_TABLE} WHERE id IN ({_marks(ids)})", list(ids)).rowcount

    def existing_uids(self, uids) -> set:
        cur = self.con.execute(f"SELECT uid FROM {TIMINGS_TABLE} WHERE uid IN ({_marks(uids)})", list(uids))
        return {u for (u,) in cur}

    def insert_timings(self, cols, values) -> None:
        at = cols.index("created_at")
        rows = [v[:at] + (_text_time(v[at]),) + v[at + 1 :] for v in values]
        self.con.executemany(f"INSERT INTO {TIMINGS_TABLE} ({', '.join(cols)}) VALUES ({_marks(cols)})", rows)
