"""SQLAlchemy 2.x models of the tuning history.

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

from datetime import datetime

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Bump when a table changes; files of another version are refused with a message (no silent reuse).
#: 2: ``timings.threads`` (the CPU threads a call used); devices' columns from typed fingerprints, one
#: CPU one device (:func:`asp_gmm.tuning_db.store.migrate` upgrades a version-1 file in place).
SCHEMA_VERSION = 3

STATUSES = ("ok", "compile-failed", "launch-failed", "invalid")
#: Covariance types and working precisions a timing may be of (asp_gmm.problem has the same lists;
#: the history imports nothing of the package).
CVTYPES = ("full", "diag", "tied", "spherical")
DTYPES = ("float32", "float64")
#: Largest value of an Integer column on every supported database (PostgreSQL's INTEGER is 32-bit).
INT_MAX = 2**31 - 1


class Base(DeclarativeBase):
    pass


class SchemaInfo(Base):
    __tablename__ = "asp_gmm_schema"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    created_by: Mapped[str] = mapped_column(String(64), default="")
    created_at: Mapped[datetime] = mapped_column(nullable=False)


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    model: Mapped[str] = mapped_column(String(256), default="")
    isa: Mapped[str] = mapped_column(String(512), default="")  # ISA extensions or compute capability
    cores: Mapped[int] = mapped_column(Integer, default=0)  # hardware threads or SMs
    driver: Mapped[str] = mapped_column(String(256), default="")
    compiler: Mapped[str] = mapped_column(String(512), default="")
    fingerprint: Mapped[str] = mapped_column(Text, nullable=False)  # canonical JSON, all fields
    created_at: Mapped[datetime] = mapped_column(nullable=False)


class Variant(Base):
    __tablename__ = "variants"
    __table_args__ = (UniqueConstraint("backend", "name", "tunables", "source_sha256", name="uq_variant"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    backend: Mapped[str] = mapped_column(String(32), nullable=False)
    name: Mapped[str] = mapped_column(String(64), nullable=False)
    tunables: Mapped[str] = mapped_column(String(512), nullable=False, default="{}")  # canonical JSON
    source_sha256: Mapped[str] = mapped_column(String(64), nullable=False)


class Timing(Base):
    __tablename__ = "timings"
    __table_args__ = (Index("ix_timings_device_problem", "device_id", "cvtype", "dtype", "D", "M", "N"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(32), unique=True, nullable=False)
    device_id: Mapped[str] = mapped_column(ForeignKey("devices.id"), nullable=False)
    variant_id: Mapped[int] = mapped_column(ForeignKey("variants.id"), nullable=False)
    N: Mapped[int] = mapped_column(Integer, nullable=False)
    D: Mapped[int] = mapped_column(Integer, nullable=False)
    M: Mapped[int] = mapped_column(Integer, nullable=False)
    cvtype: Mapped[str] = mapped_column(String(8), nullable=False)
    dtype: Mapped[str] = mapped_column(String(16), nullable=False)
    seconds: Mapped[float | None] = mapped_column(Float, nullable=True)  # per EM iteration, median
    cov_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)  # covariance part, median
    repeats: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    created_at: Mapped[datetime] = mapped_column(nullable=False)
    package_version: Mapped[str] = mapped_column(String(32), default="")
    threads: Mapped[int | None] = mapped_column(Integer, nullable=True)  # CPU threads the run used
    # schema 3: a timing measured on a sample of the events of a call of N = sampled_from events
    # (the row's N is the sample's); it stands for that call's problem class, marked apart
    sampled_from: Mapped[int | None] = mapped_column(Integer, nullable=True)
