"""The history's fixed values that need no database layer: the schema version, the allowed values
of the timing columns and the table names (:mod:`tuning_db.models` builds the SQLAlchemy tables
from these; :mod:`tuning_db.lite` reads an SQLite file with them and the standard library alone)."""

from __future__ import annotations

#: Bump when a table changes; files of another version are refused with a message (no silent reuse).
#: 2: ``timings.threads`` (the CPU threads a call used); devices' columns from typed fingerprints, one
#: CPU one device (:func:`asp_gmm.tuning_db.store.migrate` upgrades a version-1 file in place).
#: 3: ``timings.sampled_from``.
SCHEMA_VERSION = 3

STATUSES = ("ok", "compile-failed", "launch-failed", "invalid")
#: Covariance types and working precisions a timing may be of (asp_gmm.problem has the same lists;
#: the history imports nothing of the package).
CVTYPES = ("full", "diag", "tied", "spherical")
DTYPES = ("float32", "float64")
#: Largest value of an Integer column on every supported database (PostgreSQL's INTEGER is 32-bit).
INT_MAX = 2**31 - 1

SCHEMA_TABLE = "asp_gmm_schema"
DEVICES_TABLE = "devices"
VARIANTS_TABLE = "variants"
TIMINGS_TABLE = "timings"
