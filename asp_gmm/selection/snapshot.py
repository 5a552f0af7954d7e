"""The selection's aggregates of a device saved between processes, so that a process's first plan
does not read and fold the whole history.

A process's first plan on a device reads every stored row of it, folds them into the per-class
aggregates (:class:`~asp_gmm.selection.index._Index`) and fits the predictors' leave-one-out: on a
history of 13 000 rows (2-core CPU) 0.08 s of reading, 0.03 s of folding and 0.06-0.08 s of
leave-one-out for each covariance type, most of a small call's first plan. A process that built the
aggregates from the rows saves them (at its exit, with the leave-one-out results it computed) to
``<compile cache>/selection/<hash of the history and device>.json``; the next process loads them,
reads only the rows stored after them (:meth:`tuning_db.History.view`'s ``start_id``) and folds
those.

The saved aggregates are used only while they still describe the history: one of their newest rows
(:data:`ANCHORS`, of different keys of the per-class bound) must still be stored under its id with
its uid (a cleared or replaced history is read in full again, and saved again). Rows the bound
deletes later stay in the aggregates, as they stay in a running process's. They are saved again
after :data:`RESAVE_ROWS` more rows, and never from a process that folded rows not yet stored (their
ids are not known). The file is JSON (never code), written atomically (``os.replace``) in the
compile cache's private folder, and read only when it belongs to this user and no one else can
write it; any problem with it (missing, damaged, foreign) means reading the rows, as without it.
The folder keeps the :data:`KEEP_FILES` most recently used files (a load marks its file used).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import stat
import threading
from pathlib import Path

from ..tuning_db.values import bound_class

log = logging.getLogger("asp_gmm")

#: Saved-aggregates format (bumped when :meth:`_Index.state` changes).
FORMAT = 1
#: A device with fewer stored rows is read in full (quick); no file is written for it.
MIN_ROWS = 1000
#: Aggregates loaded from a file are saved again once this many newer rows have been folded.
RESAVE_ROWS = 2000
#: Rows whose ids and uids show that the history still holds the saved rows (any one suffices).
ANCHORS = 32
#: Saved files kept in the folder, the most recently used (one per history and device): a history
#: that is gone (a test's, a benchmark's temporary one) left its file behind for good, 75-430 KB
#: each (77 files, 6.2 MB, in one developer's cache after a day's benchmarks). A file removed
#: means only that its history is read in full once more.
KEEP_FILES = 32

_lock = threading.Lock()
_to_save: dict = {}  # path -> (index, the document to write: its state captured when noted)
_hooked: list = []


def _private(path: Path) -> bool:
    """``path`` is a folder of this user's that no one else can write (not followed if a link)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _path(history, device_id: str) -> Path | None:
    """The file of this history's and device's aggregates, in the compile cache's folder (made and
    checked by the compile cache: when it does not exist yet, or is not private, none)."""
    from ..config import cache_root

    root, _ = cache_root()
    if not _private(root):
        return None
    folder = root / "selection"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        log.debug("asp_gmm: no saved selection aggregates (%s)", exc)
        return None
    if not _private(folder):
        return None
    h = hashlib.sha256(f"{history.url}\0{device_id}".encode()).hexdigest()[:40]
    return folder / f"{h}.json"


def load(history, device_id: str):
    """``(state, max_id)`` saved for this history and device and still valid, else None."""
    p = _path(history, device_id)
    if p is None:
        return None
    try:  # not followed if a link; read only when this user's and no one else can write it
        with open(p, "rb", opener=lambda path, flags: os.open(path, flags | getattr(os, "O_NOFOLLOW", 0))) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                log.debug("asp_gmm: ignoring %s (not a private file of yours)", p)
                return None
            doc = json.loads(f.read())
    except (OSError, ValueError) as exc:
        log.debug("asp_gmm: ignoring the saved selection aggregates %s (%s)", p, exc)
        return None
    try:
        if doc.get("format") != FORMAT or doc.get("url") != history.url or doc.get("device_id") != device_id:
            return None
        max_id = int(doc["max_id"])
        anchors = {int(i): str(u) for i, u in doc["anchors"]}
        stored = history.row_uids(list(anchors))
        if not any(stored.get(i) == u for i, u in anchors.items()):  # cleared or replaced
            return None
        state = doc["state"]
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    try:
        os.utime(p)  # used: the last to be removed (:func:`_prune`)
    except OSError:
        pass
    return state, max_id


def capture(idx, history, device_id: str) -> None:
    """Note ``idx`` (just folded from every stored row of the device) to be saved at exit."""
    rows = idx.view.rows
    if len(rows) < MIN_ROWS and not idx.view.start_id:
        return
    if any(r.id is None for r in rows):  # a queued row: its id is not known yet
        return
    # anchors: the newest row of each of the last ANCHORS keys the bound counts by; the bound
    # deletes a row only after KEEP_PER_CLASS newer ones of its key, and a cleared or replaced
    # history holds none of them (uids are random)
    anchors, keys = [], set()
    for r in sorted(rows, key=lambda r: r.id, reverse=True):
        k = (r.variant, r.cvtype, r.dtype, r.D, r.M, r.sampled_from is not None, bound_class(r.N, r.sampled_from))
        if k not in keys:
            keys.add(k)
            anchors.append([int(r.id), r.uid])
            if len(anchors) == ANCHORS:
                break
    if not anchors:
        return
    p = _path(history, device_id)
    if p is None:
        return
    state = idx.state()
    doc = {
        "format": FORMAT,
        "url": history.url,
        "device_id": device_id,
        "max_id": anchors[0][0],
        "anchors": anchors,
        "state": state,
    }
    with _lock:
        _to_save[p] = (idx, doc)
        if not _hooked:
            atexit.register(save_all)
            _hooked.append(True)


def save_all() -> None:
    """Write the captured aggregates (at exit), with the leave-one-out results computed since for
    the same classes."""
    with _lock:
        items = list(_to_save.items())
        _to_save.clear()
    for p, (idx, doc) in items:
        try:
            counts: dict = {}
            for ck, _ in doc["state"]["classes"]:
                counts[(ck[0], ck[1])] = counts.get((ck[0], ck[1]), 0) + 1
            loo = {(cv, dt): [cv, dt, n, nn, md] for cv, dt, n, nn, md in doc["state"]["loo"]}
            for ct, (n, nn, md) in list(idx._loo.items()):
                if counts.get(ct) == n:
                    loo[ct] = [*ct, n, nn, md]
            doc["state"]["loo"] = list(loo.values())
            _write(p, doc)
            _prune(p)
        except Exception as exc:  # noqa: BLE001 - never raise at exit; the next process reads the rows
            log.debug("asp_gmm: could not save the selection aggregates %s (%s)", p, exc)


def _prune(keep: Path) -> None:
    """Remove all but the :data:`KEEP_FILES` most recently used saved files of ``keep``'s folder
    (``keep`` itself, just written, stays): only this module's names, regular files of this user."""
    files = []
    with os.scandir(keep.parent) as it:
        for e in it:
            if len(e.name) != 45 or not e.name.endswith(".json") or e.name == keep.name:
                continue
            if any(ch not in "0123456789abcdef" for ch in e.name[:40]):
                continue
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                files.append((st.st_mtime, e.path))
    files.sort(reverse=True)
    for _, path in files[KEEP_FILES - 1 :]:
        try:
            os.unlink(path)
        except OSError:
            pass


def _write(p: Path, doc: dict) -> None:
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
