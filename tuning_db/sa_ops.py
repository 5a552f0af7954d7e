"""A write transaction's statements through SQLAlchemy Core: every database SQLAlchemy reaches
(PostgreSQL, an SQLite URL with options). :class:`tuning_db.lite.LiteOps` has the same methods for
a plain SQLite file; :meth:`tuning_db.writes._Writes._insert` holds the logic once, over either."""

from __future__ import annotations

from contextlib import contextmanager

from sqlalchemy import delete, select

from .engine import _WriteTx
from .models import Device, Timing, Variant


@contextmanager
def write(engine):
    """:class:`SAOps` over one write transaction of ``engine`` (committed on leaving)."""
    with _WriteTx(engine) as conn:
        yield SAOps(conn)


class SAOps:
    def __init__(self, conn):
        self.conn = conn

    def device_exists(self, device_id: str) -> bool:
        return self.conn.execute(select(Device.id).where(Device.id == device_id)).first() is not None

    def insert_device(self, device_id: str, columns: dict, fingerprint: str, created_at) -> None:
        self.conn.execute(
            Device.__table__.insert().values(id=device_id, **columns, fingerprint=fingerprint, created_at=created_at)
        )

    def variant_id(self, backend: str, name: str, tunables: str, sha: str):
        q = select(Variant.id).where(
            Variant.backend == backend,
            Variant.name == name,
            Variant.tunables == tunables,
            Variant.source_sha256 == sha,
        )
        return self.conn.execute(q).scalar()

    def insert_variant(self, backend: str, name: str, tunables: str, sha: str) -> int:
        ins = Variant.__table__.insert().values(backend=backend, name=name, tunables=tunables, source_sha256=sha)
        return self.conn.execute(ins).inserted_primary_key[0]

    def ok_timings(self, device_id, variant_id, cvtype, dtype, D, M):
        """``(id, N, sampled_from)`` of the ok timings of one key, newest first."""
        T = Timing.__table__.c
        q = (
            select(T.id, T.N, T.sampled_from)
            .where(
                T.device_id == device_id,
                T.cvtype == cvtype,
                T.dtype == dtype,
                T.D == D,
                T.M == M,
                T.variant_id == variant_id,
                T.status == "ok",
            )
            .order_by(T.id.desc())
        )
        return self.conn.execute(q).all()

    def delete_timings(self, ids) -> int:
        return self.conn.execute(delete(Timing).where(Timing.__table__.c.id.in_(ids))).rowcount

    def existing_uids(self, uids) -> set:
        return set(self.conn.execute(select(Timing.uid).where(Timing.uid.in_(uids))).scalars())

    def insert_timings(self, cols, values) -> None:
        self.conn.execute(Timing.__table__.insert(), [dict(zip(cols, v)) for v in values])
