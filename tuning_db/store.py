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

import threading
import time
from pathlib import Path

from . import lite
from .engine import _Engine
from .forksafe import GATE, dispose
from .reads import _Reads, DeviceView  # noqa: F401
from .transfer import _Transfer
from .schema import SCHEMA_VERSION
from .values import EXPORT_FORMAT, KEEP_PER_CLASS, Row, VariantKey, canonical_json, default_url  # noqa: F401
from .writes import _Writes, _registry


class History(_Engine, _Writes, _Reads, _Transfer):
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
        self._engine_obj = None  # the SQLAlchemy engine, made on first use (see _engine)
        self._engine_lock = threading.Lock()
        # a plain SQLite file is read with the standard library (tuning_db.lite): a process that
        # only reads before its first plan does not wait for SQLAlchemy's import
        self._lite_path = lite.plain_path(self.url)
        if self._lite_path is not None:
            self.is_sqlite, self.path, self.where = True, self._lite_path, self._lite_path
            with GATE.inside():
                version = lite.schema_version(self._lite_path)
            if version != SCHEMA_VERSION:
                # new, older, foreign or unreadable: the engine creates, migrates or refuses it now
                self._make_engine_now()
        else:
            self._make_engine_now()
        if background:
            from .writer import Writer

            self._writer = Writer(self)
        _registry().histories.add(self)

    def close(self) -> None:
        """Flush and release the connections."""
        self.flush()
        if self._engine_obj is not None:
            dispose(self._engine_obj)
        _registry().histories.discard(self)
