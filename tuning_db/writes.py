"""Writing a history: the queue, batched inserts, the bound per class; flushing at exit."""

from __future__ import annotations

import atexit
import os
import threading
import time
import weakref

from . import lite
from .devices import device_of
from .forksafe import GATE
from .schema import STATUSES
from .values import Row, VariantKey, _now, bound_class, canonical_json, log


class _OpenHistories:
    """The histories open in this process, flushed at interpreter exit and reset in a forked child.

    One instance is made when the first :class:`History` opens (:func:`_registry`); only then are
    the exit and fork hooks registered, so importing this module has no side effect.
    """

    def __init__(self):
        self.histories: "weakref.WeakSet" = weakref.WeakSet()
        atexit.register(self.flush_all_at_exit)
        if hasattr(os, "register_at_fork"):
            # a fork waits for the SQLite calls in progress on other threads (tuning_db/forksafe.py)
            os.register_at_fork(
                before=GATE.before_fork,
                after_in_parent=GATE.after_fork_in_parent,
                after_in_child=GATE.after_fork_in_child,
            )
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
            if h._engine_obj is not None:
                h._engine_obj.dispose(close=False)  # never share the parent's connections
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
        with self._write_ops() as ops:
            if bound:
                rows = self._bound(ops, rows)
            fps = dict(self._fingerprints)
            fps.update(devices or {})
            for dev in {r.device_id for r in rows}:
                self._ensure_device(ops, dev, fps.get(dev, {}))
            existing = set()
            if skip_existing:
                uids = [r.uid for r in rows]
                for i in range(0, len(uids), 500):
                    existing.update(ops.existing_uids(uids[i : i + 500]))
            values = [
                (
                    r.uid,
                    r.device_id,
                    self._variant_id(ops, r.variant),
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
            if values:
                ops.insert_timings(TIMING_COLUMNS, values)
        return len(values)

    def _write_ops(self):
        """A write transaction's statements (:class:`tuning_db.lite.LiteOps` on a plain SQLite
        file, :class:`tuning_db.sa_ops.SAOps` through the engine otherwise), as a context manager."""
        if self._lite_path is not None:
            return lite.write(self._lite_path)
        from .sa_ops import write

        return write(self._engine)

    def _bound(self, ops, rows) -> list:
        """Keep the history's growth bounded: before ``rows`` are inserted, delete the oldest ok
        timings of each (device, configuration, cvtype, dtype, D, M, problem class, sampled or
        not) that ``rows`` add to, so that at most :attr:`keep_per_class` remain with the new ones;
        returns ``rows`` without the oldest ok ones of a class beyond that bound within the batch.
        The problem class is N in half-octaves (``round(2 log2 N)``, of ``sampled_from`` for a
        sampled timing), as selection groups timings; failures are always kept (a few per key)."""
        keep = self.keep_per_class
        if not keep:
            return rows
        touched: dict = {}
        skip = set()
        for r in reversed(rows):  # newest first: the batch's own oldest beyond the bound are dropped
            if r.status == "ok":
                k = (r.device_id, r.variant, r.cvtype, r.dtype, r.D, r.M)
                cls = (bound_class(r.N, r.sampled_from), r.sampled_from is not None)
                touched.setdefault(k, {}).setdefault(cls, 0)
                if touched[k][cls] >= keep:
                    skip.add(r.uid)
                else:
                    touched[k][cls] += 1
        if skip:
            rows = [r for r in rows if r.uid not in skip]
        for (dev, vk, cv, dt, D, M), classes in touched.items():
            vid = self._variant_id(ops, vk)
            seen: dict = {}
            drop = []
            for id_, N, sf in ops.ok_timings(dev, vid, cv, dt, D, M):  # newest first
                sf = sf if isinstance(sf, int) and sf > 0 else None
                cls = (bound_class(N, sf), sf is not None)
                if cls not in classes:
                    continue
                seen[cls] = seen.get(cls, 0) + 1
                if seen[cls] + classes[cls] > keep:
                    drop.append(id_)
            for i in range(0, len(drop), 500):
                ops.delete_timings(drop[i : i + 500])
        return rows

    def _ensure_device(self, ops, device_id: str, fp: dict):
        if device_id in self._known_devices:
            return
        if not ops.device_exists(device_id):
            ops.insert_device(device_id, device_of(fp).columns(), canonical_json(fp), _now())
        self._known_devices.add(device_id)

    def _variant_id(self, ops, key: VariantKey) -> int:
        vid = self._variant_ids.get(key)
        if vid is None:
            vid = ops.variant_id(key.backend, key.name, key.tunables, key.source_sha256)
            if vid is None:
                vid = ops.insert_variant(key.backend, key.name, key.tunables, key.source_sha256)
            self._variant_ids[key] = vid
        return vid


#: the columns :meth:`_Writes._insert` writes, in the order of its value tuples
TIMING_COLUMNS = (
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
