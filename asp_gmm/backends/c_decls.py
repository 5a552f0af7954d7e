"""The C declarations the C backend's libraries are called through (cffi, ABI mode), and their
parsed form.

Parsing C declarations needs pycparser: its import and tables took 36 ms of every process that used
the C backend (2-core CPU). ``scripts/gen_cffi.py`` writes the parsed form of each declaration set
as a module of this package (cffi's out-of-line ABI mode: ``_ffi_c.py``, ``_ffi_c_batch.py``, no
C source, nothing compiled); :func:`load_ffi` imports it when it was made from these very
declarations (it records their SHA-256) and parses them here otherwise (an edited declaration, or
a cffi whose backend does not take the module). ``tests/test_c_ffi.py`` fails when a module is
stale.
"""

from __future__ import annotations

import hashlib
import importlib

CORE_CDEF = """
typedef struct asp_state asp_state;
int asp_abi(void);
void asp_set_threads(asp_state *s, int n);
int asp_tile(void);
asp_state *asp_create(const void *X, int64_t n, int d, int m, void *xt, void *resp, void *logprob,
                      double *weights, double *means, double *covars, double *nk);
void asp_destroy(asp_state *s);
int asp_set_params(asp_state *s, double reg_covar);
int asp_estep(asp_state *s);
double asp_loglik(asp_state *s);
int asp_bad_component(asp_state *s);
const char *asp_error(asp_state *s);
int asp_em(asp_state *s, void *cov_fn, int moments, int min_iters, int max_iters, double tol, double reg_covar,
           double *ll_out, int *iters_out, int *converged_out, double *iter_seconds, double *cov_seconds,
           double *ll_trace);
int asp_covariance(const void *view, double *acc);
int asp_load(asp_state *s, const void *X, int64_t n);
int asp_stats(asp_state *s, void *cov_fn, int moments, double *out);
void asp_set_weights(asp_state *s, const double *w);
"""

#: The batch library holds the core and the batch driver.
BATCH_CDEF = (
    CORE_CDEF
    + """
int asp_batch_abi(void);
asp_state *asp_batch_create(const void *X, int64_t n, int d, int m, void *xt, void *resp, void *logprob,
                            double *weights, double *means, double *covars, double *nk);
asp_state *asp_batch_create_rows(const void *X, const int64_t *index, int64_t n, int d, int m, void *xt, void *resp,
                                 void *logprob, double *weights, double *means, double *covars, double *nk);
void asp_batch_em(asp_state **st, int nb, int nthreads, int min_iters, int max_iters, double tol,
                  const double *reg, int *rc, double *ll, int *iters, int *conv, double *trace, double *seconds);
void asp_batch_estep(asp_state **st, int nb, int nthreads, int *rc, double *ll);
void asp_batch_set_params(asp_state **st, int nb, int nthreads, const double *reg, int *rc);
void asp_batch_pack(const void *X, int64_t n, int d, void *xt);
void asp_batch_score(asp_state **st, int nb, int nthreads, const void **xts, const int64_t *ns, void **outs,
                     int *rc, double *ll);
"""
)

#: The modules scripts/gen_cffi.py writes: module name -> declarations.
MODULES = {"_ffi_c": CORE_CDEF, "_ffi_c_batch": BATCH_CDEF}


def cdef_sha256(cdef: str) -> str:
    return hashlib.sha256(cdef.encode()).hexdigest()


def load_ffi(module: str, cdef: str):
    """The cffi FFI of ``cdef``: module ``asp_gmm.backends.<module>`` when it was generated from
    ``cdef``, else parsed now."""
    try:
        mod = importlib.import_module(f"{__package__}.{module}")
        if mod.CDEF_SHA256 == cdef_sha256(cdef):
            return mod.ffi
    except Exception:  # noqa: BLE001 - missing, stale or refused by this cffi: parse instead
        pass
    import cffi

    ffi = cffi.FFI()
    ffi.cdef(cdef)
    return ffi
