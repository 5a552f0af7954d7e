"""Export, import, repair and clearing of a history."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .errors import HistoryError, SchemaMismatchError
from .schema import SCHEMA_VERSION
from .values import EXPORT_FORMAT, _fingerprint_problem, _now, _parse_export, _row_to_json, _tunables_problem


class _Transfer:
    """Export, import and repair of :class:`~.store.History` (a part of it)."""

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
            from .migrations import _export_from_1

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
        from sqlalchemy import delete, select

        from .models import Device, Timing, Variant

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
