"""Writing a history: the queue, batched inserts, the bound per class; flushing at exit."""

from __future__ import annotations

from __future__ import annotations

import atexit
import math
import os
import threading
import time
import weakref

from sqlalchemy import delete, select

from .devices import device_of
from .models import STATUSES, Device, Timing, Variant
from .values import Row, VariantKey, _now, canonical_json, log


class _OpenHistories:
    """The histories open in this process, flushed at interpreter exit and reset in a forked child.

    One instance is made when the first :class:`History` opens (:func:`_registry`); only then are
    the exit and fork hooks registered, so importing this module has no side effect.
    """

    def __init__(self):
        self.histories: "weakref.WeakSet" = weakref.WeakSet()
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


class _Writes:
    """Recording and flushing of :class:`~.store.History` (a part of it)."""

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
                self._bound(conn, rows)
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

    def _bound(self, conn, rows) -> None:
        """Keep the history's growth bounded: before ``rows`` are inserted, delete the oldest ok
        timings of each (device, configuration, cvtype, dtype, D, M, problem class, sampled or
        not) that ``rows`` add to, so that at most :attr:`keep_per_class` remain with the new ones.
        The problem class is N in half-octaves (``round(2 log2 N)``, of ``sampled_from`` for a
        sampled timing), as selection groups timings; failures are always kept (a few per key)."""
        keep = self.keep_per_class
        if not keep:
            return
        T = Timing.__table__.c
        touched: dict = {}
        for r in rows:
            if r.status == "ok":
                k = (r.device_id, r.variant, r.cvtype, r.dtype, r.D, r.M)
                cls = (round(2 * math.log2(max(r.sampled_from or r.N, 1))), r.sampled_from is not None)
                touched.setdefault(k, {}).setdefault(cls, 0)
                touched[k][cls] += 1
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
