"""SQLAlchemy 2.x tables of the tuning history (SQLAlchemy Core: importing the ORM would cost a
fresh process ~0.1 s before its first ``train``, for nothing the history uses).

Four tables:

``schema_info``
    One row: the schema version of the file (:data:`SCHEMA_VERSION`) and the package that created it.
    A database without it is not an asp_gmm history (or is empty, and gets created).
``devices``
    One row per device fingerprint. ``id`` is the caller's stable device id (sha256 of the canonical
    JSON fingerprint); the columns repeat the fingerprint's main fields for reading and querying,
    ``fingerprint`` keeps all of it.
``variants``
    One row per (backend, name, tunables, source sha256): changing a template's source makes a new
    row, so old timings are never mistaken for the new code.
``timings``
    Every measurement and every failure (never only the winner): problem (N, D, M, cvtype, dtype),
    seconds per EM iteration (median of ``repeats``), seconds in the covariance variant, status
    (``ok``, ``compile-failed``, ``launch-failed``, ``invalid``), when, and by which package version.
    ``uid`` makes export/import idempotent.
"""

from __future__ import annotations

from sqlalchemy import (
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from .schema import (  # noqa: F401  (re-exported: the tables' fixed values live there)
    CVTYPES,
    DEVICES_TABLE,
    DTYPES,
    INT_MAX,
    SCHEMA_TABLE,
    SCHEMA_VERSION,
    STATUSES,
    TIMINGS_TABLE,
    VARIANTS_TABLE,
)


class _Model:
    """A table with its columns as attributes (``Timing.uid``, ``Timing.__table__``); usable
    wherever SQLAlchemy takes a table (``select_from(Timing)``, ``delete(Timing)``)."""

    def __init__(self, table: Table):
        self.__table__ = table
        self.__tablename__ = table.name

    def __getattr__(self, name):
        try:
            return self.__table__.c[name]
        except KeyError:
            raise AttributeError(f"table {self.__tablename__} has no column {name!r}") from None

    def __clause_element__(self):
        return self.__table__


class Base:
    """What ``create_all`` needs: the tables' metadata."""

    metadata = MetaData()


SchemaInfo = _Model(
    Table(
        SCHEMA_TABLE,
        Base.metadata,
        Column("id", Integer, primary_key=True),
        Column("version", Integer, nullable=False),
        Column("created_by", String(64), default=""),
        Column("created_at", DateTime, nullable=False),
    )
)

Device = _Model(
    Table(
        DEVICES_TABLE,
        Base.metadata,
        Column("id", String(64), primary_key=True),
        Column("backend", String(32), nullable=False),
        Column("model", String(256), default=""),
        Column("isa", String(512), default=""),  # ISA extensions or compute capability
        Column("cores", Integer, default=0),  # hardware threads or SMs
        Column("driver", String(256), default=""),
        Column("compiler", String(512), default=""),
        Column("fingerprint", Text, nullable=False),  # canonical JSON, all fields
        Column("created_at", DateTime, nullable=False),
    )
)

Variant = _Model(
    Table(
        VARIANTS_TABLE,
        Base.metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("backend", String(32), nullable=False),
        Column("name", String(64), nullable=False),
        Column("tunables", String(512), nullable=False, default="{}"),  # canonical JSON
        Column("source_sha256", String(64), nullable=False),
        UniqueConstraint("backend", "name", "tunables", "source_sha256", name="uq_variant"),
    )
)

Timing = _Model(
    Table(
        TIMINGS_TABLE,
        Base.metadata,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column("uid", String(32), unique=True, nullable=False),
        Column("device_id", ForeignKey("devices.id"), nullable=False),
        Column("variant_id", ForeignKey("variants.id"), nullable=False),
        Column("N", Integer, nullable=False),
        Column("D", Integer, nullable=False),
        Column("M", Integer, nullable=False),
        Column("cvtype", String(8), nullable=False),
        Column("dtype", String(16), nullable=False),
        Column("seconds", Float, nullable=True),  # per EM iteration, median
        Column("cov_seconds", Float, nullable=True),  # covariance part, median
        Column("repeats", Integer, nullable=False, default=1),
        Column("status", String(16), nullable=False),
        Column("created_at", DateTime, nullable=False),
        Column("package_version", String(32), default=""),
        Column("threads", Integer, nullable=True),  # CPU threads the run used
        # schema 3: a timing measured on a sample of the events of a call of N = sampled_from events
        # (the row's N is the sample's); it stands for that call's problem class, marked apart
        Column("sampled_from", Integer, nullable=True),
        Index("ix_timings_device_problem", "device_id", "cvtype", "dtype", "D", "M", "N"),
    )
)
