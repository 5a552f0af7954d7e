"""GPU test helpers (imported by tests/test_cuda_v6.py and tests/test_cuda_v7.py).

``mstep_probe`` runs one M-step of V6 on the GPU and reads back its scratch, to compare the unguarded
tensor-core centring with the exact float64 sums; ``labelled_blobs`` makes blobs with the parameters of
their true labelling.
"""

from __future__ import annotations

import numpy as np

from asp_gmm import registry
from asp_gmm.problem import Problem


def mstep_probe(X, weights, means, covars, tunables=None):
    """One E-step + moments + V6 on (X, parameters). Returns a dict: exact (M, D) float64 centred sums
    from the posteriors V6 read, tc (M, D) the tensor-core centring from its partials, acc (M, D) what
    V6 wrote (guarded), ratio (M, D) = S2 / exact, flags (M,) bool."""
    from asp_gmm.backends import cuda as cu

    N, D = X.shape
    M = len(weights)
    be = cu.CudaBackend()
    p = Problem(N, D, M, "diag", "float32")
    v = registry.get("cuda", "V6", "covariance")
    tun = dict(v.default_tunables(), **(tunables or {}))
    kern = be.kernel(v, tun, p)
    s = be.open(np.ascontiguousarray(X, np.float32), p)
    try:
        assert s.problem.M == M, "probe shapes must not be padded (use M = 1..8 or a class size)"
        s.set_params(weights, means, covars, 1e-6)
        drv, b = s.drv, s.buf
        with s.dev.active():
            s._run_estep()
            s._means(0)
            nbytes, confs = s._plan(kern.handle, cu.COV_ARGS, scratch_bytes=True)
            scr = b.ensure_scratch(nbytes)
            ev = [drv.Event() for _ in range(len(confs) + 1)]
            ev[0].record(b.stream)
            singles = [[conf] for conf in confs]  # kept alive: _run_plan memoises by the list's id
            for i, one in enumerate(singles):  # V6's launches one by one, timed
                s._run_plan(one, scr)
                ev[i + 1].record(b.stream)
            s._sync()
            launch_ms = {conf[0]: ev[i + 1].time_since(ev[i]) for i, conf in enumerate(confs)}
            resp = np.empty((M, b.ldn), np.float32)
            drv.memcpy_dtoh(resp, b.resp)
            mu = np.empty(M * D, np.float32)
            drv.memcpy_dtoh(mu, b.ptr("mu"))
            acc = np.empty(M * D, np.float64)
            drv.memcpy_dtoh(acc, b.acc)
            scratch = np.empty(nbytes // 8, np.float64)
            drv.memcpy_dtoh(scratch, b.scratch)
    finally:
        s.close()
    mu = mu.reshape(M, D).astype(np.float64)
    r = resp[:, :N].astype(np.float64)
    Xd = X.astype(np.float32).astype(np.float64)
    exact = np.stack([(r[c][:, None] * (Xd - mu[c]) ** 2).sum(0) for c in range(M)])
    shift = scratch[:D]
    flags = scratch[D : D + M] != 0
    part = scratch[D + M :].reshape(tun["blocks"], M, 2 * D + 1).sum(0)
    s1, s0, s2 = part[:, :D], part[:, D], part[:, D + 1 :]
    mup = mu - shift
    tc = s2 - 2 * mup * s1 + mup**2 * s0[:, None]
    return dict(exact=exact, tc=tc, acc=acc.reshape(M, D), ratio=s2 / exact, flags=flags, launch_ms=launch_ms)


def labelled_blobs(rng, N, D, M, spread, scale, offset):
    """Blobs (centres N(0, spread^2), per-dimension spreads scale x U(0.5, 1.5), + offset) and the
    parameters of their true labelling: (X float32 (N, D), weights (M,), means (M, D), variances (M, D))."""
    centres = rng.normal(0.0, spread, (M, D))
    scales = rng.uniform(0.5, 1.5, (M, D)) * scale
    lab = rng.integers(0, M, N)
    X = (centres[lab] + rng.standard_normal((N, D)) * scales[lab] + offset).astype(np.float32)
    w = np.bincount(lab, minlength=M) / N
    mu = np.stack([X[lab == c].mean(0) for c in range(M)]).astype(np.float64)
    cv = np.stack([X[lab == c].var(0) for c in range(M)]).astype(np.float64) + 1e-6
    return X, w, mu, cv


#: .nv.info attributes of a cubin (NVIDIA's ELF): per-kernel register count and stack frame size
_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE = 0x2F, 0x11
#: shared memory the sm_90 driver reserves per block; the cubin's .nv.shared.<kernel> size includes it
SYSTEM_SHARED = 1024


def cubin_resources(cubin: bytes) -> dict:
    """``{kernel: {"registers", "frame", "shared"}}`` read from a cubin itself, whichever compiler
    (NVRTC or nvcc) made it and whatever it printed: registers per thread and stack frame bytes per
    thread (spills go there: 0 means no spills) from the ``.nv.info`` attributes, static shared
    memory bytes (without the system's :data:`SYSTEM_SHARED`) from the ``.nv.shared.<kernel>``
    section. What ``cuobjdump -res-usage`` prints, without needing it installed."""
    import struct

    if cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise ValueError("not a 64-bit ELF cubin")
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entsize, count, strndx = struct.unpack_from("<HHH", cubin, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", cubin, shoff + i * entsize) for i in range(count)]

    def cstr(at):
        return cubin[at : cubin.index(b"\0", at)].decode()

    secs = {cstr(heads[strndx][4] + h[0]): h for h in heads}
    symtab, strtab = secs[".symtab"], secs[".strtab"]

    def symbol(i):
        return cstr(strtab[4] + struct.unpack_from("<I", cubin, symtab[4] + 24 * i)[0])

    out: dict = {}
    info = secs[".nv.info"]
    blob, i = cubin[info[4] : info[4] + info[5]], 0
    while i + 4 <= len(blob):
        fmt, attr = blob[i], blob[i + 1]
        if fmt != 4:  # values held in the entry itself
            i += 4
            continue
        size = struct.unpack_from("<H", blob, i + 2)[0]
        if attr in (_EIATTR_REGCOUNT, _EIATTR_FRAME_SIZE) and size == 8:
            sym, val = struct.unpack_from("<II", blob, i + 4)
            k = out.setdefault(symbol(sym), {"registers": 0, "frame": 0, "shared": 0})
            k["registers" if attr == _EIATTR_REGCOUNT else "frame"] = val
        i += 4 + size
    for name, k in out.items():
        sh = secs.get(f".nv.shared.{name}")
        k["shared"] = max(int(sh[5]) - SYSTEM_SHARED, 0) if sh is not None else 0
    return out
