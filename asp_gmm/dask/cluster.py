"""One Dask worker per GPU on this host (:func:`gpu_cluster`), and the worker specs it is made of."""

from __future__ import annotations

import os

from ._client import DaskInputError


def gpu_count() -> int:
    """GPUs this host shows: ``CUDA_VISIBLE_DEVICES`` if set, else the CUDA driver's count (0 without one)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is not None:
        return len([v for v in vis.split(",") if v.strip() and v.strip() != "-1"])
    try:
        import pycuda.driver as drv

        drv.init()
        return drv.Device.count()
    except Exception:  # noqa: BLE001 - no pycuda or no driver
        return 0


def gpu_worker_specs(n_gpus: int, threads_per_worker: int = 1) -> dict:
    """``distributed.SpecCluster`` worker specs: one nanny-managed worker process per GPU, each seeing
    only its GPU through ``CUDA_VISIBLE_DEVICES`` (used where dask-cuda is not installed). The
    workers have no host memory limit: their blocks live in device memory, which Dask's spilling
    to disk (driven by the sizes it counts) must not move."""
    from distributed import Nanny

    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in vis.split(",") if v.strip()] if vis else [str(i) for i in range(n_gpus)]
    return {
        f"gpu-{i}": {
            "cls": Nanny,
            "options": {"nthreads": threads_per_worker, "memory_limit": 0, "env": {"CUDA_VISIBLE_DEVICES": ids[i]}},
        }
        for i in range(n_gpus)
    }


def gpu_cluster(n_gpus: int | None = None, **kwargs):
    """A local cluster with one worker per GPU: ``dask_cuda.LocalCUDACluster`` where dask-cuda is
    installed, else a ``distributed.SpecCluster`` of :func:`gpu_worker_specs`. ``kwargs`` go to
    the cluster class. Use it as ``with gpu_cluster() as cluster, Client(cluster) as client:``."""
    n = gpu_count() if n_gpus is None else int(n_gpus)
    if n < 1:
        raise DaskInputError(
            "no GPU is visible here (CUDA_VISIBLE_DEVICES or the CUDA driver); use a "
            "distributed.LocalCluster of CPU workers instead"
        )
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        from distributed import Scheduler, SpecCluster

        return SpecCluster(
            workers=gpu_worker_specs(n), scheduler={"cls": Scheduler, "options": {"dashboard_address": None}}, **kwargs
        )
    return LocalCUDACluster(n_workers=n, **kwargs)
