"""The tuning history: every measured timing and failure of every variant, per device.

Installed as ``asp_gmm.tuning_db``. It knows nothing of backends or of the public API: callers hand
it plain values (a device id and fingerprint, a :class:`VariantKey`, problem sizes).

    from asp_gmm.tuning_db import History, VariantKey
    h = History()                          # $ASP_GMM_DB or the SQLite file in the user data folder
    h.record(device_id, fingerprint, VariantKey.of("c", "V3", {}, sha), N, D, M, "full", "float32",
             "ok", seconds=0.012, cov_seconds=0.008, repeats=5)
    h.view(device_id).rows                 # in memory, refreshed incrementally
    h.export("history.json"); h.import_("history.json")
"""

from .errors import HistoryError, SchemaMismatchError

_LAZY = {
    "SCHEMA_VERSION": "models",
    "STATUSES": "models",
    "History": "store",
    "Row": "store",
    "VariantKey": "store",
    "canonical_json": "store",
    "default_url": "store",
}

__all__ = [
    "History",
    "HistoryError",
    "Row",
    "SchemaMismatchError",
    "VariantKey",
    "SCHEMA_VERSION",
    "STATUSES",
    "canonical_json",
    "default_url",
]


def __getattr__(name):
    # the database layer (SQLAlchemy) loads on first use, so that naming the errors costs nothing
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
