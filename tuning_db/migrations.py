"""Schema migrations and the reading of older export formats."""

from __future__ import annotations

import json

from sqlalchemy import delete, select

from .devices import device_id as _device_id
from .devices import device_of
from .models import Device, SchemaInfo, Timing
from .values import _now, canonical_json


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
