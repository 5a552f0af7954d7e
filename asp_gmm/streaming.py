"""Streamed EM: training on data that does not fit the device (or the host), one block at a time.

Every EM pass reads the data once, in chunks, from a *chunk source*:

* a NumPy array or ``numpy.memmap`` (rows sliced ``X[a:b]``);
* an h5py or zarr dataset, or any array-like with a 2-D ``shape`` and row slicing;
* a callable returning a fresh iterable of 2-D row chunks each time it is called (re-iterable: it is
  called once per pass and must yield the same rows every time);
* a :class:`ChunkSource`.

Rows are copied into blocks of a fixed size chosen by the backend (cache-sized on the C backend),
so the result does not depend on how the source cuts its chunks. Per block the backend runs the
E-step and returns the sufficient statistics (:class:`asp_gmm.backends.base.BlockStats`); they are
added across blocks in float64 with compensated (Neumaier) sums, centred on the current means, and
one M-step per pass turns them into the new parameters with the reference formulas (empty
components keep their mean and covariance). Whole-data posteriors are never stored.

Settings
--------
``ASP_GMM_DEVICE_BUDGET``
    Bytes (``"2e9"``, ``"512M"``, ``"8G"``) an in-memory fit may take on the backend's device; a
    larger ``X`` is streamed. Default: ``ASP_GMM_MEMORY_FRACTION`` of the free memory (GPU memory for
    CUDA, available host memory for C and NumPy).
``ASP_GMM_MEMORY_FRACTION``
    Default 0.5.
``ASP_GMM_CHUNK_BYTES``
    Bytes of the source read at a time from an array-like (default 64 MiB; rounded to the dataset's
    own chunking where it has one).
``ASP_GMM_BLOCK_BYTES``
    Bytes of data and posteriors per block handed to the backend (backend default: the last-level
    cache's size, at least 8 MiB, on C; 64 MiB elsewhere).
``ASP_GMM_PROGRESS``
    ``auto`` (default: a progress bar per pass when stderr is a terminal and a pass reads at least
    10^7 events), ``1`` (always, where tqdm is installed) or ``0``.
"""

from .fit.passes import StreamPlan, _Progress, em, pass_stats, plan, source_stats  # noqa: F401
from .fit.seed import seed, seeded_as  # noqa: F401
from .fit.sources import (  # noqa: F401
    ArraySource,
    CallableSource,
    ChunkSource,
    as_source,
    blocks,
    check_chunk,
    device_budget,
    is_source,
    memory_fraction,
    wants_stream,
)
from .fit.stats import SuffStats, reduced_mstep  # noqa: F401
from .problem import as_cvtype, per_component  # noqa: F401  (tied/spherical as their kernels' per-component types)
