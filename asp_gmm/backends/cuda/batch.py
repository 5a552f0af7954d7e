"""Batched EM on the GPU: the ``phase = "batch"`` variants of ``variants/cuda`` (``GB``: a ragged
batch with offsets, one launch per EM phase for the whole batch).

All members' events are concatenated into one float32 array ``X [Ntot][D]`` (member b owns rows
``off[b]:off[b+1]``), uploaded once; blocks of the E-step are mapped to members by two small
tables (``blk_member``, ``blk_first``), so no member is padded to another's N. Parameters live on
the device as ``[B][MP]`` arrays, MP the batch's largest M rounded up to its component class
(components past a member's M have weight 0 and are skipped). Per EM iteration the host issues
two launches (M-step, E-step) and reads back B log-likelihoods and B status words, and decides
each member's convergence by the one rule on arrays (:func:`asp_gmm.reference.converged_many`);
members that are done or failed are switched off for the next launches.
"""

from __future__ import annotations

import contextlib
import threading

import numpy as np

from ...errors import NonFiniteError, NotPositiveDefiniteError
from ...problem import BatchProblem, Problem
from ...reference import change_per_event, converged_many
from ..base import Kernel
from ..batch_base import BatchRuns, BatchSession, BatchSupport, DeviceStack
from .backend import component_class
from .compile import binary_name, cubin_path, is_cached, load_module, render_source
from .batch_layout import FACTOR_THREADS, SIGNATURES, SPLIT_SIGNATURES, is_split, msum_blocks, packed_cells, prec_cells
from .staging import PINNED_FROM, PinnedRows


def binary_problem(problem) -> Problem:
    """The class a batched binary is compiled for: D, the largest M rounded up to its component
    class, cvtype, dtype (N and the member count are run-time arguments)."""
    return Problem(0, problem.D, component_class(problem.M), problem.cvtype, problem.dtype)


class CudaBatchSupport(BatchSupport):
    """Compiles and loads the CUDA batched variants (one module per (D, component class, cvtype,
    tunables))."""

    preference = ("GBS", "GB")
    takes_parts = True
    takes_rows = True

    def __init__(self, backend):
        super().__init__(backend)
        self._mods: dict = {}
        self.pinned = PinnedRows(backend.device)
        self._lock = threading.Lock()

    def tunables_for(self, variant, problem):
        bp = BatchProblem(problem.N, problem.D, component_class(problem.M), problem.cvtype, problem.dtype, B=problem.B)
        return variant.first_allowed(bp, extra=self.backend.limit_context())

    def _source(self, variant, tun, problem):
        p = binary_problem(problem)
        return render_source(variant, tun, p), binary_name(variant, tun, p)

    def _tun(self, variant, tunables):
        tun = variant.default_tunables()
        tun.update(tunables or {})
        return tun

    def _key(self, variant, tun, problem):
        p = binary_problem(problem)
        return (variant.key, variant.source_sha256, tuple(sorted(tun.items())), p.D, p.M, p.cvtype, p.dtype)

    def readiness_token(self):
        return (len(self._found), len(self._mods))

    def is_ready(self, variant, tunables, problem):
        tun = self._tun(variant, tunables)
        key = self._key(variant, tun, problem)
        if key in self._mods:
            return True

        def lookup():
            src, name = self._source(variant, tun, problem)
            return is_cached(src, self.backend.device.arch, name)

        return self._in_cache(key, lookup)

    def kernel(self, variant, tunables, problem):
        tun = self._tun(variant, tunables)
        key = self._key(variant, tun, problem)
        k = self._mods.get(key)
        if k is not None:
            return k
        dev = self.backend.device
        src, name = self._source(variant, tun, problem)
        # compiled outside the lock, so that classes and configurations compile in parallel threads
        # (the compile cache's per-entry file lock keeps two threads from compiling the same one;
        # under this lock a cold run's compiles of several batch classes ran one after the other)
        cubin_path(src, dev.arch, name)
        with self._lock:
            k = self._mods.get(key)
            if k is None:
                mod, path = load_module(dev, src, name)
                fns = {}
                sigs = {**SIGNATURES, **(SPLIT_SIGNATURES if is_split(variant) else {})}
                with dev.active():
                    for fname, sig in sigs.items():
                        fn = mod.get_function(fname)
                        fn.prepare(sig)
                        fns[fname] = fn
                k = self._mods[key] = Kernel(variant, tun, handle=(mod, fns, binary_problem(problem)), binary=str(path))
        return k

    def prepare_class(self, problem):
        """Load the module whose upload kernel copies a frozen recording to the device for this
        class's calls on :class:`asp_gmm.Rows` (float32 only; one module per D, see
        :func:`upload_problem`)."""
        if problem.dtype == "float32":
            self.backend.core(upload_problem(problem.N, problem.D))

    def open(self, Xs, problems, kernel):
        return CudaBatchSession(self.backend, Xs, problems, kernel, pinned=self.pinned)


def upload_problem(N: int, D: int) -> Problem:
    """The problem whose EM core module supplies the upload kernel (``asp_upload_chunk``) of a
    resident recording of N rows of D float32 values: that kernel depends on D and the precision
    only, so every batch class of one D shares one module (M = 1, diagonal)."""
    return Problem(N, D, 1, "diag", "float32")


#: byte alignment of the buffers carved from a session's one allocation
_ALIGN = 256


class CudaBatchSession(BatchSession):
    """The members' events and parameters on the GPU (see the module documentation)."""

    def __init__(self, backend, Xs, problems, kernel, pinned=None):
        self.backend, self.problems = backend, list(problems)
        self.dev = dev = backend.device
        self.drv = dev.drv
        _mod, self.fns, bp = kernel.handle
        self.threads = int(kernel.tunables["threads"])
        # GBS: the M-step over chunks of `chunk` events (a chunk table like the E-step's blocks)
        self.chunk = int(kernel.tunables["chunk"]) if "asp_batch_msum" in self.fns else 0
        self.D, self.MP, self.full = bp.D, bp.M, bp.cvtype == "full"
        self.cells = self.D * (self.D + 1) // 2 if self.full else self.D
        B, T = len(problems), self.threads
        Ns = np.array([p.N for p in problems], np.int64)
        self.off = np.zeros(B + 1, np.int32)
        np.cumsum(Ns, out=self.off[1:])
        TE = T * int(kernel.tunables.get("ept", 1))  # events a block of the E-step
        nblk = -(-Ns // TE)
        self.nblocks = int(nblk.sum())
        blk_member = np.repeat(np.arange(B, dtype=np.int32), nblk)
        starts = np.repeat(self.off[:-1].astype(np.int64), nblk)
        within = np.arange(self.nblocks, dtype=np.int64) - np.repeat(np.cumsum(nblk) - nblk, nblk)
        blk_first = (starts + within * TE).astype(np.int32)
        chk_member = chk_first = np.zeros(1, np.int32)
        self.nchunks = 0
        if self.chunk:
            nch = -(-Ns // self.chunk)
            self.nchunks = int(nch.sum())
            chk_member = np.repeat(np.arange(B, dtype=np.int32), nch)
            cstart = np.repeat(self.off[:-1].astype(np.int64), nch)
            cwithin = np.arange(self.nchunks, dtype=np.int64) - np.repeat(np.cumsum(nch) - nch, nch)
            chk_first = (cstart + cwithin * self.chunk).astype(np.int32)
        self.mcount = np.array([p.M for p in problems], np.int32)
        # members given the same array (scoring one data set under many models) share its rows; a
        # member given as parts (asp_gmm.Concat: two clusters' frames for their merged model) gets
        # rows of its own, copied on the device from its parts, each distinct part uploaded once
        first, parts, xoff, rows = {}, [], np.zeros(B, np.int64), 0
        joins, src, srows = [], {}, 0  # (member's first row, its parts); id(part) -> (row in S, part)
        # members given as rows of an immutable array (asp_gmm.Rows) first, grouped by array: one
        # gather per array from its resident copy on the device (no host gather, no upload)
        gathers, rowsof = [], {}
        device = None  # a (B, N, D) CUDA array (DeviceStack): copied on the device
        if isinstance(Xs, DeviceStack):
            xoff[:] = self.off[:-1]
            device, rows, Xs = Xs, int(self.off[-1]), ()
        elif isinstance(Xs, np.ndarray) and Xs.ndim == 3:
            # one (B, N, D) array (asp_gmm.GMMBatch): the members' rows already in order, one copy
            xoff[:] = self.off[:-1]
            parts, rows, Xs = [Xs.reshape(-1, Xs.shape[2])], int(self.off[-1]), ()
        else:
            Xs = list(Xs)
        for b, Xb in enumerate(Xs):
            if getattr(Xb, "index", None) is not None and isinstance(getattr(Xb, "X", None), np.ndarray):
                rowsof.setdefault(id(Xb.X), (Xb.X, []))[1].append(b)
        for A, members in rowsof.values():
            resident = self._resident(A, bp)
            if resident is None:  # not kept on the device (too large, or not float32): host rows
                for b in members:
                    Xs[b] = A[Xs[b].index]
                continue
            r0, idx = rows, []
            for b in members:
                xoff[b] = rows
                rows += len(Xs[b].index)
                idx.append(Xs[b].index)
            gathers.append((r0, resident, np.concatenate(idx).astype(np.int32)))
        taken = {b for A, members in rowsof.values() for b in members if not isinstance(Xs[b], np.ndarray)}
        nidx = sum(len(g[2]) for g in gathers)
        for b, Xb in enumerate(Xs):
            if b in taken:
                continue
            ps = getattr(Xb, "parts", None)
            if ps is not None:
                xoff[b] = rows
                joins.append((rows, ps))
                rows += sum(len(q) for q in ps)
                for q in ps:
                    if id(q) not in src:
                        src[id(q)] = (srows, q)
                        srows += len(q)
                continue
            k = id(Xb)
            if k not in first:
                first[k] = rows
                parts.append(Xb)
                rows += len(Xb)
            xoff[b] = first[k]
        ntot = int(self.off[-1])
        self._bufs = []
        MP, D, C = self.MP, self.D, self.cells
        # every buffer carved from one allocation (one cuMemAlloc and one free per session instead
        # of eighteen: the 1-hour diarization opens 86 sessions), the members' index arrays copied
        # up in one transfer; the distinct parts (S) last
        index = [xoff.astype(np.int32), self.off, blk_member, blk_first, self.mcount, chk_member, chk_first]
        # GBS's sums (doubles), then the members' shifts [B][D]
        self.acc_words = 2 * B * MP * (1 + D + C) + 2 * B * D if self.chunk else 0
        sizes = [rows * D * 4] + [a.nbytes for a in index]
        sizes += [max(ntot, 1) * MP * 4, max(ntot, 1) * 4, B * MP * 8, B * MP * D * 8, B * MP * C * 8]
        sizes += [
            B * MP * D * 4,
            B * MP * prec_cells(D, self.full) * 4,
            B * MP * 4,
            B * 8,
            B * 4,
            B * 4,
            B * 8,
            srows * D * 4,
            nidx * 4,
        ]
        sizes += [self.acc_words * 4]
        offs, total = [], 0
        for n in sizes:
            offs.append(total)
            total += -(-max(int(n), 8) // _ALIGN) * _ALIGN
        with dev.active():
            base = int(self._alloc(total))
            ptr = [base + o for o in offs]
            (self.X, self.d_xoff, self.d_off, self.d_blk_member, self.d_blk_first, self.d_mcount) = ptr[:6]
            (self.d_chk_member, self.d_chk_first) = ptr[6:8]
            (self.resp, self.lp, self.wsrc, self.mu, self.cov, self.muf, self.prec) = ptr[8:15]
            (self.logd, self.ll, self.act, self.bad, self.reg, S, G, self.acc) = ptr[15:]
            packed = np.zeros(offs[8] - offs[1], np.uint8)  # the index arrays at their offsets
            for a, o in zip(index, offs[1:8]):
                packed[o - offs[1] : o - offs[1] + a.nbytes] = a.view(np.uint8)
            self.drv.memcpy_htod(self.d_xoff, packed)
            # large arrays straight to their rows on the device (no host concatenation of the
            # merged clusters' frames); many small ones concatenated first (one copy, not one each)
            starts = [first[id(q)] for q in parts] if first else [0] * len(parts)
            if pinned is not None and sum(q.size for q in parts) * 4 >= PINNED_FROM:
                pinned.upload(self.X, D, starts, parts)  # through the page-locked buffer
                parts = []
            elif not joins and len(parts) > 1 and rows * D * 4 < len(parts) << 17:
                # (parts of 128 KB and more go one copy each: a copy call costs ~20 us, and
                # concatenating a 32-member diarization batch's 20 MB on the host cost ~3 ms)
                # without joins the plain arrays' rows follow one another (after any gathered rows)
                parts, starts = [np.concatenate(parts)], starts[:1]
            for row, part in zip(starts, parts):
                a = np.ascontiguousarray(part, dtype=np.float32)
                if a.nbytes:
                    self.drv.memcpy_htod(self.X + row * D * 4, a)
            if device is not None:
                if device.dtype != np.float32 or device.shape != (B, ntot // max(B, 1), D):
                    raise ValueError(
                        f"the batch's CUDA array is {device.dtype} {device.shape}; it needs float32 (B, N, {D})"
                    )
                self.drv.memcpy_dtod(self.X, device.ptr, rows * D * 4)
            for at, q in src.values():
                a = np.ascontiguousarray(q, dtype=np.float32)
                if a.nbytes:
                    self.drv.memcpy_htod(S + at * D * 4, a)
            if gathers:  # every Rows member's rows from its array's resident copy
                self.drv.memcpy_htod(G, np.concatenate([g[2] for g in gathers]))
                at = 0
                for r0, (xt, ldn), idx in gathers:
                    n = len(idx)
                    if n:
                        self.fns["asp_batch_gather"].prepared_call(
                            (-(-n * D // 256), 1, 1), (256, 1, 1), int(xt), int(ldn), G + at * 4, n, self.X + r0 * D * 4
                        )
                    at += n
            for row, ps in joins:  # each joined member's rows from its parts, on the device
                for q in ps:
                    n = len(q) * D * 4
                    if n:
                        self.drv.memcpy_dtod(self.X + row * D * 4, S + src[id(q)][0] * D * 4, n)
                    row += len(q)
        self._raw = None  # (wsrc, mu, cov) as loaded or read back after a run: packed, padded
        self._host = None  # ... made into the members' parameters when they are asked for
        self._reg = np.zeros(B)

    # ------------------------------------------------------------------ memory
    def _resident(self, A, bp):
        """``(device pointer, leading dimension)`` of the immutable float32 array A's transposed copy
        kept by the backend (uploaded, and checked for NaN on the device, the first time), or None."""
        if A.dtype != np.float32 or A.ndim != 2 or A.shape[1] != self.D or not 0 < len(A) < 2**31:
            return None  # (the gather's row numbers are 32-bit)
        p = upload_problem(len(A), self.D)
        upload = next(fn for spec, fn in self.backend.core(p).funcs if spec.kernel == "asp_upload_chunk")
        return self.backend.memory.resident_xt(A, p, upload)

    def _alloc(self, nbytes):
        buf = self.backend.memory.acquire_bytes(max(int(nbytes), 8))
        self._bufs.append(buf)
        return buf

    def close(self):
        if self._bufs:
            bufs, self._bufs = self._bufs, []
            try:
                with self.dev.active():
                    # nothing left queued may still use the block the next session is given (a
                    # free would have waited for it too)
                    self.drv.Context.synchronize()
            except Exception:  # noqa: BLE001 - a failed launch left the context unusable (the error
                # that stopped the session is the caller's to see, not this one): the blocks are
                # freed as far as the driver lets, never given to another session
                for b in bufs:
                    with contextlib.suppress(Exception):
                        b.free()
                return
            for b in bufs:
                self.backend.memory.release(b)

    # ------------------------------------------------------------------ parameters
    def set_params(self, params, reg_covars):
        B, MP, D, C = len(self.problems), self.MP, self.D, self.cells
        ms = {len(p[0]) for p in params}
        if len(ms) == 1:  # one M: every member at once
            return self.set_params_stacked(
                np.stack([p[0] for p in params]),
                np.stack([p[1] for p in params]),
                np.stack([p[2] for p in params]),
                reg_covars,
            )
        w = np.zeros((B, MP))
        mu = np.zeros((B, MP, D))
        cov = np.zeros((B, MP, C))
        pack = packed_cells(D)[0]
        for b, (wb, mb, cb) in enumerate(params):
            m = len(wb)
            w[b, :m] = wb
            mu[b, :m] = mb
            cov[b, :m] = np.take(np.reshape(cb, (m, D * D)), pack, axis=1) if self.full else cb
        return self._load(w, mu, cov, reg_covars)

    def set_params_stacked(self, weights, means, covars, reg_covars):
        B, MP, D, C = len(self.problems), self.MP, self.D, self.cells
        m = weights.shape[1]
        w = np.zeros((B, MP))
        mu = np.zeros((B, MP, D))
        cov = np.zeros((B, MP, C))
        w[:, :m] = weights
        mu[:, :m] = means
        if self.full:
            cov[:, :m] = np.take(np.reshape(covars, (B, m, D * D)), packed_cells(D)[0], axis=2)
        else:
            cov[:, :m] = covars
        return self._load(w, mu, cov, reg_covars)

    def _load(self, w, mu, cov, reg_covars):
        """The padded parameters ``(B, MP)``, ``(B, MP, D)``, ``(B, MP, cells)`` to the device and
        factored there; per member ``None`` or its refusal."""
        B, MP = len(self.problems), self.MP
        self._reg = np.asarray(reg_covars, np.float64)
        with self.dev.active():
            self.drv.memcpy_htod(self.wsrc, w)
            self.drv.memcpy_htod(self.mu, mu)
            self.drv.memcpy_htod(self.cov, cov)
            self.drv.memcpy_htod(self.reg, self._reg)
            self.drv.memcpy_htod(self.act, np.ones(B, np.int32))
            self.drv.memset_d32(self.bad, 0, B)
            self.fns["asp_batch_factor"].prepared_call(
                (B * MP, 1, 1),
                FACTOR_THREADS,
                self.act,
                self.d_mcount,
                self.mu,
                self.cov,
                self.muf,
                self.prec,
                self.logd,
                self.bad,
            )
            bad = np.zeros(B, np.int32)
            self.drv.memcpy_dtoh(bad, self.bad)
        self._store(w, mu, cov)
        out = [None] * B
        for b in np.flatnonzero(bad):
            out[b] = NotPositiveDefiniteError(int(bad[b]) - 1, float(self._reg[b]))
        return out

    def params_stacked(self):
        m = self.problems[0].M
        w, mu, cov = self._params_host()
        return w[:, :m], mu[:, :m], cov[:, :m]

    def params(self, b):
        w, mu, cov = self._params_host()
        m = self.problems[b].M
        return w[b, :m].copy(), mu[b, :m].copy(), cov[b, :m].copy()

    def _store(self, w, mu, cov):
        """Keep the packed parameters (the unpacking waits until they are asked for: those loaded
        before a run are replaced by the run's before anyone reads them)."""
        self._raw, self._host = (w, mu, cov), None

    def _params_host(self):
        """Host copies of every member's parameters: weights normalised over the member's own
        components (padding weighs 0), full covariances unpacked, all members at once."""
        if self._host is not None:
            return self._host
        if self._raw is None:
            raise RuntimeError("no parameters yet")
        w, mu, cov = self._raw
        tot = w.sum(axis=1, keepdims=True)
        w = w / np.where(tot > 0, tot, 1.0)
        if self.full:
            cov = np.take(cov, packed_cells(self.D)[1], axis=2).reshape(cov.shape[:2] + (self.D, self.D))
        self._host = (w, mu, cov)
        return self._host

    def _read_params(self):
        B = len(self.problems)
        w = np.empty((B, self.MP))
        mu = np.empty((B, self.MP, self.D))
        cov = np.empty((B, self.MP, self.cells))
        self.drv.memcpy_dtoh(w, self.wsrc)
        self.drv.memcpy_dtoh(mu, self.mu)
        self.drv.memcpy_dtoh(cov, self.cov)
        self._store(w, mu, cov)

    # ------------------------------------------------------------------ running
    def _estep(self, status=False):
        """Launch the E-step and wait for its log-likelihoods (B,); ``status``: also the M-step's
        status words (0, or 1 + a component not positive definite), read in the same copy."""
        self.drv.memset_d32(self.ll, 0, 2 * len(self.problems))
        self.fns["asp_batch_estep"].prepared_call(
            (max(self.nblocks, 1), 1, 1),
            (self.threads, 1, 1),
            self.X,
            self.d_xoff,
            self.d_off,
            self.d_blk_member,
            self.d_blk_first,
            self.act,
            self.d_mcount,
            self.wsrc,
            self.muf,
            self.prec,
            self.logd,
            self.resp,
            self.lp,
            self.ll,
        )
        B = len(self.problems)
        if status:  # ll, act, bad: one copy instead of two waits an iteration
            words = np.empty((self.bad - self.ll) // 4 + B, np.int32)
            self.drv.memcpy_dtoh(words, self.ll)
            return words[: 2 * B].view(np.float64).copy(), words[-B:].copy()
        ll = np.empty(B)
        self.drv.memcpy_dtoh(ll, self.ll)
        return ll

    def _mstep(self):
        """The M-step's launches (no wait: the status words are read with the E-step's results)."""
        if self.chunk:
            return self._mstep_split()
        B = len(self.problems)
        self.fns["asp_batch_mstep"].prepared_call(
            (B * self.MP, 1, 1),
            (self.threads, 1, 1),
            self.X,
            self.d_xoff,
            self.d_off,
            self.act,
            self.d_mcount,
            self.resp,
            self.reg,
            *self._mstep_out(),
        )

    def _mstep_out(self):
        """What an M-step writes (both forms): weights, means, covariances, the E-step's factors,
        the status words."""
        return (self.wsrc, self.mu, self.cov, self.muf, self.prec, self.logd, self.bad)

    def _mstep_split(self):
        """GBS: the M-step in two launches over chunks of the members' events (see the
        template's GBS section); the sums are zeroed first."""
        B, MP, T = len(self.problems), self.MP, (self.threads, 1, 1)
        shift = self.acc + 8 * B * MP * (1 + self.D + self.cells)  # the members' shifts, after the sums
        self.drv.memset_d32(self.acc, 0, self.acc_words)
        if self.nchunks:
            args = (self.X, self.d_xoff, self.d_off, self.d_chk_member, self.d_chk_first, self.act, self.d_mcount)
            grid = (self.nchunks, msum_blocks(self.D, MP, self.full, self.threads), 1)
            self.fns["asp_batch_msum"].prepared_call(grid, T, *args, self.resp, self.mu, self.acc, shift)
        self.fns["asp_batch_mfinal"].prepared_call(
            (B * MP, 1, 1),
            FACTOR_THREADS,
            self.act,
            self.d_mcount,
            self.reg,
            self.acc,
            shift,
            *self._mstep_out(),
        )

    def em(self, *, min_iters, max_iters, tol, reg_covars, skip=()):
        return self.em_arrays(
            min_iters=min_iters, max_iters=max_iters, tol=tol, reg_covars=reg_covars, skip=skip
        ).member_runs()

    def em_arrays(self, *, min_iters, max_iters, tol, reg_covars, skip=()):
        """Every member's EM loop: two launches per iteration for the whole batch, then each
        member's state decided on arrays (errors, the convergence rule of
        :func:`asp_gmm.reference.converged_many`, traces): a batch of 1 000 small problems spent
        3 ms a iteration in a Python loop over its members."""
        B = len(self.problems)
        N = np.maximum(np.diff(self.off), 1).astype(np.float64)  # events a member (1 000 max() calls: 0.25 ms)
        skipped = np.zeros(B, bool)
        skipped[list(skip)] = True
        active = ~skipped
        trace = np.full((B, max_iters + 1), np.nan)
        iters = np.zeros(B, np.int64)
        conv = np.zeros(B, bool)
        errors: dict = {}
        with self.dev.active():
            self.drv.memcpy_htod(self.act, active.astype(np.int32))
            ll = self._estep()
            trace[:, 0] = ll
            last = ll.copy()
            for b in np.flatnonzero(active & ~np.isfinite(ll)):
                errors[b] = _nonfinite(ll[b])
            active &= np.isfinite(ll)
            it = 0
            sent = None
            while it < max_iters and active.any():
                if sent is None or not np.array_equal(sent, active):
                    sent = active.copy()
                    self.drv.memcpy_htod(self.act, active.astype(np.int32))
                # the M-step's status words are read with the E-step's log-likelihoods (one wait an
                # iteration, not two): a member whose M-step failed is decided by its status, its
                # E-step's result ignored; its parameters are those the M-step left, as before
                self._mstep()
                ll, bad = self._estep(status=True)
                it += 1
                failed = active & (bad != 0)
                for b in np.flatnonzero(failed):
                    errors[b] = NotPositiveDefiniteError(int(bad[b]) - 1, float(reg_covars[b]))
                nonfinite = active & ~failed & ~np.isfinite(ll)
                for b in np.flatnonzero(nonfinite):
                    errors[b] = _nonfinite(ll[b])
                ok = active & ~failed & ~nonfinite
                change = change_per_event(np.where(ok, ll, 0.0), np.where(ok, last, 0.0), N)
                trace[ok, it] = ll[ok]
                iters[ok] = it
                last[ok] = ll[ok]
                done = ok & converged_many(it, min_iters, change, tol)
                conv |= done
                active = ok & ~done
            self._read_params()
        last[skipped] = np.nan
        trace[skipped] = np.nan
        return BatchRuns(last, iters, conv, trace, errors, skipped)

    def score(self, skip=()):
        B = len(self.problems)
        active = np.array([b not in skip for b in range(B)], np.int32)
        out = [None] * B
        with self.dev.active():
            self.drv.memcpy_htod(self.act, active)
            ll = self._estep()
            lp = np.empty(int(self.off[-1]), np.float32)
            self.drv.memcpy_dtoh(lp, self.lp)
        for b in np.flatnonzero(active):
            out[b] = _nonfinite(ll[b]) if not np.isfinite(ll[b]) else lp[self.off[b] : self.off[b + 1]].copy()
        return out


def _nonfinite(v) -> NonFiniteError:
    return NonFiniteError(
        f"the log-likelihood is not finite ({v}): a component has collapsed onto a few events or the data has an "
        "extreme range. Increase reg_covar, use fewer components, or scale the data."
    )
