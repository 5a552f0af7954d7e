"""Reading a history: rows, the in-memory per-device view and its incremental refresh."""

from __future__ import annotations

import json
import time
import warnings

from . import lite
from .values import Row, VariantKey, _Bad, _check_values, _fingerprint_problem, _timestamp, _tunables_problem, log


class DeviceView:
    """Every row of one device, in memory; ``rows`` only grows (``generation`` counts additions)."""

    def __init__(self, device_id: str, start_id: int = 0):
        self.device_id = device_id
        #: the stored rows with ``id <= start_id`` are not in this view (their reader holds them
        #: otherwise: the selection's saved aggregates, asp_gmm/selection/snapshot.py)
        self.start_id = start_id
        self.rows: list = []
        self.uids: set = set()
        self.max_id = start_id
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


class _Reads:
    """Reading of :class:`~.store.History` (a part of it)."""

    # ------------------------------------------------------------------ reading
    def rows(
        self, device_id: str | None = None, since_id: int = 0, limit: int | None = None, newest_first: bool = False
    ) -> list:
        """Stored rows (queued ones are flushed first), optionally of one device."""
        self.flush()
        return self._run(lambda: self._select(device_id, since_id, limit, newest_first), "read")

    def _select(self, device_id, since_id, limit=None, newest_first=False, ids=None):
        if self._lite_path is not None:  # a plain SQLite file: the standard library reads it
            raw = lite.select_rows(self._lite_path, device_id, since_id, limit, newest_first, ids)
            rows, bad = self._rows(raw)
        else:
            with self._engine.connect() as conn:
                rows, bad = self._read(conn, device_id, since_id, limit, newest_first, ids)
        self._warn_damaged(bad)
        return rows

    def _read(self, conn, device_id, since_id, limit=None, newest_first=False, ids=None):
        """``(rows, damaged)``: the stored rows that can be read, and ``[(id, what is wrong)]`` of
        those that cannot (values no asp_gmm writes; SQLite keeps any value in any column)."""
        from sqlalchemy import String, select, type_coerce

        from .models import Timing, Variant

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
        if ids is not None:
            q = q.where(T.id.in_(ids))
        q = q.order_by(T.id.desc() if newest_first else T.id)
        if limit is not None:
            q = q.limit(limit)
        return self._rows(conn.execute(q).all())

    def _rows(self, raw):
        """``(rows, damaged)`` of raw timing tuples (the columns of :meth:`_read`'s query, as
        :data:`tuning_db.lite._COLUMNS` also reads them)."""
        keys: dict = {}
        out, bad = [], []
        for id_, uid, dev, vb, vn, vt, vs, N, D, M, cv, dt, st, sec, csec, rep, at, pv, thr, sf in raw:
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

    def view(self, device_id: str, start_id: int = 0) -> DeviceView:
        """The in-memory rows of ``device_id`` (loaded on first use, refreshed when stale).

        ``start_id``: when this call makes the view, it holds only the stored rows with a larger id
        (and the queued ones); a view made before keeps its own :attr:`DeviceView.start_id`."""
        v = self._views.get(device_id)
        now = time.monotonic()
        if v is not None and now - v.loaded_at < self.refresh_interval:
            return v
        with self._lock:
            v = self._views.get(device_id)
            if v is None:
                v = self._views[device_id] = DeviceView(device_id, max(0, int(start_id)))
                for r in list(self._pending):
                    if r.device_id == device_id:
                        v._add(r)
            if not v.loaded_at:
                start = v.start_id
                for r in self._run(lambda: self._select(device_id, start), "read"):
                    v._add(r)
            else:
                self._run(lambda: self._refresh(v), "read")
            v.loaded_at = time.monotonic()
        return v

    def drop_view(self, device_id: str) -> None:
        """Forget the in-memory view of ``device_id``: the next :meth:`view` reads it again."""
        with self._lock:
            self._views.pop(device_id, None)

    def row_uids(self, ids) -> dict:
        """``{id: uid}`` of the stored rows among ``ids`` (a deleted or cleared row is missing)."""
        ids = [int(i) for i in ids][: lite.ID_CHUNK]

        def q():
            if self._lite_path is not None:
                return lite.row_uids(self._lite_path, ids)
            from sqlalchemy import select

            from .models import Timing

            T = Timing.__table__.c
            with self._engine.connect() as conn:
                return dict(conn.execute(select(T.id, T.uid).where(T.id.in_(ids))).all())

        return self._run(q, "read") if ids else {}

    def _refresh(self, v: DeviceView) -> None:
        """Add the rows stored since ``v`` was read. Only (id, uid) of the newer rows are read first:
        most are this process's own rows, already in the view, and need not be read back."""
        if self._lite_path is not None:
            new = lite.newer_ids(self._lite_path, v.device_id, v.max_id)
        else:
            from sqlalchemy import select

            from .models import Timing

            T = Timing.__table__.c
            with self._engine.connect() as conn:
                new = conn.execute(select(T.id, T.uid).where(T.device_id == v.device_id, T.id > v.max_id)).all()
        if not new:
            return
        missing = [i for i, uid in new if uid not in v.uids]
        for k in range(0, len(missing), lite.ID_CHUNK):
            ids = missing[k : k + lite.ID_CHUNK]
            for r in self._select(v.device_id, min(ids) - 1, ids=ids):
                v._add(r)
        v.max_id = max(v.max_id, max(i for i, _ in new))

    def devices(self) -> list:
        """``[(device_id, fingerprint dict, number of rows)]`` of the stored devices."""
        self.flush()

        from sqlalchemy import func, select

        from .models import Device, Timing

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
        from sqlalchemy import func, select

        from .models import Timing

        self.flush()

        def q():
            with self._engine.connect() as conn:
                return conn.execute(select(func.count()).select_from(Timing)).scalar()

        return self._run(q, "read")

    def clear(self) -> int:
        """Delete every timing, variant and device (the schema stays); return the timings deleted."""
        from sqlalchemy import delete, func, select

        from .models import Device, Timing, Variant

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
