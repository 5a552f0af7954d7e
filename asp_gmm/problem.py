"""The problem a specialized call solves: sizes, covariance type and precision."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CVTYPES = ("full", "diag")
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
    cvtype : {"full", "diag"}
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
        """Covariance cells computed per component (lower triangle for full, D for diag)."""
        return self.D * (self.D + 1) // 2 if self.cvtype == "full" else self.D

    @property
    def work(self) -> float:
        """Approximate multiply-adds of one EM iteration, N * M * (D + 1)^2: the size measure that
        thread counts and exploration thresholds compare against."""
        return float(self.N) * self.M * (self.D + 1) ** 2

    @property
    def np_dtype(self):
        return np.dtype(self.dtype)

    def as_dict(self) -> dict:
        return dict(N=self.N, D=self.D, M=self.M, cvtype=self.cvtype, dtype=self.dtype, cells=self.cells)


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
        p0 = problems[0]
        return cls(sum(p.N for p in problems), p0.D, max(p.M for p in problems), p0.cvtype, p0.dtype, B=len(problems))
