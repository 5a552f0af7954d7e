"""The history's exceptions (no database import, so that they can be named without loading SQLAlchemy).

``asp_gmm.errors.HistoryError`` derives from :class:`HistoryError` and from ``asp_gmm.errors.ASPGMMError``
(this package imports nothing of ``asp_gmm``).
"""

from __future__ import annotations


class HistoryError(Exception):
    """The history cannot be used; the message names the database and what to do."""


class SchemaMismatchError(HistoryError):
    """A database or export file of another schema version."""
