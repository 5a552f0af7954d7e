"""The batched CUDA kernels as the host sees them (``variants/cuda/batch.cu.j2``): their argument
signatures, launch shapes and the sizes of the device arrays the template lays out, in one place
beside the session that uses them (:mod:`asp_gmm.backends.cuda.batch`)."""

from __future__ import annotations

import functools

import numpy as np

#: pycuda argument signatures of the batched kernels (P: a device pointer)
SIGNATURES = {
    "asp_batch_factor": "PPPPPPPP",
    "asp_batch_estep": "PPPPPPPPPPPPPP",
    "asp_batch_mstep": "PPPPPPPPPPPPPP",
    "asp_batch_gather": "PiPiP",
}
#: the split M-step's kernels (GBS: manifests with ``derived split = 1``)
SPLIT_SIGNATURES = {
    "asp_batch_msum": "PPPPPPPPPPP",
    "asp_batch_mfinal": "PPPPPPPPPPPP",
}
#: threads of a block of the kernels that factor covariances (a warp per component)
FACTOR_THREADS = (32, 1, 1)


def prec_cells(D: int, full: bool) -> int:
    """Values of one component's E-step factor on the device (``NCELLSP`` of the template): full,
    the upper factor's columns each padded to a multiple of 4; diag, D."""
    return sum((j + 4) // 4 * 4 for j in range(D)) if full else D


def msum_blocks(D: int, MP: int, full: bool, threads: int) -> int:
    """Blocks a chunk of GBS's sums (``NPG`` of the template): a thread a (component, tile of
    cells) pair (fewer pairs than threads: one block, the pairs' events split between threads),
    full covariances cut into 4 x 4 tiles of the lower triangle, diag a dimension."""
    tr = -(-D // 4)
    tiles = tr * (tr + 1) // 2 if full else D
    pairs = MP * tiles
    return -(-pairs // min(pairs, threads))


def is_split(variant) -> bool:
    """Whether the batched variant runs the M-step split over chunks of events (GBS)."""
    return str(variant.extra.get("derived", {}).get("split", "0")).strip() == "1"


@functools.lru_cache(maxsize=64)
def packed_cells(D: int) -> tuple:
    """``(pack, unpack)`` for the device's packed covariances (the lower triangle's cells in
    ``np.tril_indices(D)`` order, as every CUDA full-covariance kernel stores them: cell
    i (i + 1) / 2 + j): ``pack`` (cells,) the cells' places in a row-major D x D matrix,
    ``unpack`` (D * D,) the cell of each place (the symmetric matrix). As flat take-indices: a
    32-member batch's fancy-indexed (un)packing cost 0.2-1 ms a call. Used by the batches and by
    the streamed statistics (:mod:`asp_gmm.backends.cuda.stream`)."""
    il = np.tril_indices(D)
    pos = np.empty((D, D), np.intp)
    pos[il] = pos[il[1], il[0]] = np.arange(len(il[0]))
    pack, unpack = il[0] * D + il[1], pos.ravel()
    pack.flags.writeable = unpack.flags.writeable = False
    return pack, unpack
