"""The problem a specialized call solves: sizes, covariance type and precision."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CVTYPES = ("full", "diag", "tied", "spherical")
#: The covariance type whose kernels compute a type's sums: "tied" runs the full kernels with one
#: shared precision factor, "spherical" the diagonal ones with one variance per component.
KERNEL_CVTYPE = {"full": "full", "tied": "full", "diag": "diag", "spherical": "diag"}
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class Problem:
    """One EM problem.

    Attributes
    ----------
    N : int
        Number of events (rows of X).
    D : int
        Dimensions (features).
    M : int
        Mixture components.
    cvtype : {"full", "diag", "tied", "spherical"}
    dtype : {"float32", "float64"}
    """

    N: int
    D: int
    M: int
    cvtype: str = "full"
    dtype: str = "float32"

    def __post_init__(self):
        if self.cvtype not in CVTYPES:
            raise ValueError(f"cvtype must be one of {CVTYPES}, got {self.cvtype!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def cells(self) -> int:
        """Covariance cells computed per component (lower triangle for full and tied, D for diag and
        spherical): the sums of the kernels that run the type."""
        return self.D * (self.D + 1) // 2 if self.kernel_cvtype == "full" else self.D

    @property
    def kernel_cvtype(self) -> str:
        """ "full" for "full" and "tied", "diag" for "diag" and "spherical" (:data:`KERNEL_CVTYPE`)."""
        return KERNEL_CVTYPE[self.cvtype]

    def covars_shape(self) -> tuple:
        """Shape of the covariances: (M, D, D) full, (D, D) tied, (M, D) diag, (M,) spherical."""
        return {"full": (self.M, self.D, self.D), "tied": (self.D, self.D), "diag": (self.M, self.D)}.get(
            self.cvtype, (self.M,)
        )

    @property
    def work(self) -> float:
        """Approximate multiply-adds of one EM iteration, N * M * (D + 1)^2: the size measure that
        thread counts and exploration thresholds compare against."""
        return float(self.N) * self.M * (self.D + 1) ** 2

    @property
    def np_dtype(self):
        return np.dtype(self.dtype)

    def as_dict(self) -> dict:
        """The names the manifests' limits and the templates see: ``cvtype`` is the family of kernels
        that run the problem ("full" for full and tied, "diag" for diag and spherical), so that a
        variant's geometry is the same for both members; ``cov_kind`` is the exact type (what the EM
        cores read to pool a tied covariance or average a spherical one)."""
        return dict(
            N=self.N,
            D=self.D,
            M=self.M,
            cvtype=self.kernel_cvtype,
            cov_kind=self.cvtype,
            dtype=self.dtype,
            cells=self.cells,
        )


def per_component(covars, cvtype: str, M: int, D: int) -> np.ndarray:
    """Covariances of ``cvtype`` as the per-component ones of its kernel type (float64): "tied" (D, D)
    repeated to (M, D, D), "spherical" (M,) to (M, D); "full" and "diag" unchanged."""
    covars = np.asarray(covars, np.float64)
    if cvtype == "tied":
        return np.repeat(covars.reshape(1, D, D), M, axis=0)
    if cvtype == "spherical":
        return np.repeat(covars.reshape(M, 1), D, axis=1)
    return covars


def as_cvtype(covars, cvtype: str) -> np.ndarray:
    """The inverse of :func:`per_component` on covariances it produced."""
    covars = np.asarray(covars, np.float64)
    if cvtype == "tied":
        return covars[0].copy()
    if cvtype == "spherical":
        return covars[:, 0].copy()
    return covars


@dataclass(frozen=True)
class BatchProblem(Problem):
    """Many independent problems of one D, cvtype and dtype trained in one call (the class a
    batched variant is selected and timed for).

    Attributes
    ----------
    N : int
        Events of all members together (timings are compared per event, as for one problem).
    M : int
        The largest member's components (smaller members are padded or run at their own M).
    B : int
        Members.
    """

    B: int = 1

    def as_dict(self) -> dict:
        return dict(super().as_dict(), B=self.B)

    @classmethod
    def of(cls, problems) -> "BatchProblem":
        """The batch class of a non-empty list of :class:`Problem` of one D, cvtype and dtype."""
        p0, B = problems[0], len(problems)
        if problems.count(p0) == B:  # one Problem for every member (a GMMBatch): no loop over them
            return cls(p0.N * B, p0.D, p0.M, p0.cvtype, p0.dtype, B=B)
        return cls(sum(p.N for p in problems), p0.D, max(p.M for p in problems), p0.cvtype, p0.dtype, B=B)
