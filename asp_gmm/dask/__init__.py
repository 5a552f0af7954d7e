"""Distributed EM on Dask (``dask.distributed``): :func:`fit` trains a GMM on a ``dask.array`` with
the data resident on the workers and the EM loop where the data is.

* **Resident data.** ``fit`` persists X on the cluster (a persisted X stays where it is). One
  long-running task per worker that holds blocks of X (:func:`asp_gmm.dask._worker.worker_loop`)
  receives its blocks in place, validates and converts each once and keeps it: in host memory on a
  CPU worker, in device memory on a GPU worker (a CuPy-backed ``dask.array`` is used where it lies;
  NumPy blocks are uploaded once), see :mod:`asp_gmm.dask._cuda`.
* **The loop on the workers.** Per pass the client puts the parameters on each loop's Dask queue;
  every loop runs the specialized kernels its worker chose (C or CUDA, by that worker's own
  selection) over its resident blocks and puts back only float64 sufficient statistics
  (:class:`asp_gmm.streaming.SuffStats`, kilobytes to a few megabytes); the client sums them in a
  fixed order and does the M-step. Nothing else travels: no graph per pass, no block.
* **Lost workers.** While it waits, the client checks that every loop's worker is alive. When one
  is lost, the loops of that generation are stopped, Dask recomputes the lost blocks from X's graph
  (from their source), new loops start over wherever the blocks now live and the pass is repeated
  from the last parameters: the answer does not change.
* **Any cluster.** ``LocalCluster``, ``LocalCUDACluster`` or :func:`gpu_cluster` (one worker per
  GPU), a cluster started with ``dask scheduler`` / ``dask worker``, or a batch system through
  dask-jobqueue (README: a SLURM example).

Requires ``dask[array]`` and ``distributed`` (``pip install asp_gmm[dask]``).
"""

from ._client import DaskFitResult, DaskInputError, WorkersLostError, fit
from .cluster import gpu_cluster, gpu_count, gpu_worker_specs

__all__ = ["fit", "DaskFitResult", "DaskInputError", "WorkersLostError", "gpu_cluster", "gpu_count", "gpu_worker_specs"]
