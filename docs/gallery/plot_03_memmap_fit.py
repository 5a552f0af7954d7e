"""
Fitting data on disk (a memmap)
===============================

:meth:`asp_gmm.GMM.train` takes a :class:`numpy.memmap` (also an h5py or zarr dataset, or a callable
that yields row chunks) and streams it one block at a time, so the data never has to fit in memory.
The iterations are those of the in-memory fit: the answers agree to rounding.
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from asp_gmm import GMM

rng = np.random.default_rng(1)
M, D, N = 4, 8, 200_000
centres = rng.normal(0, 4, (M, D))
X = (centres[rng.integers(0, M, N)] + rng.normal(size=(N, D))).astype(np.float64)

folder = tempfile.TemporaryDirectory()
path = Path(folder.name) / "features.npy"
np.save(path, X)

# %%
# Open the file as a memmap: nothing is read yet. ``train`` reads it once per EM pass.
Xm = np.load(path, mmap_mode="r")
print(type(Xm).__name__, Xm.shape, Xm.dtype)

on_disk = GMM(M, D, cvtype="diag", dtype=np.float64)
on_disk.train(Xm, min_em_iters=5, max_em_iters=5)
print("variant:", on_disk.last_variant)

# %%
# The same model trained on the array in memory: the same parameters.
in_memory = GMM(M, D, cvtype="diag", dtype=np.float64)
in_memory.train(X, min_em_iters=5, max_em_iters=5)
print("variant:", in_memory.last_variant)
print("largest difference of the means:", float(np.abs(on_disk.means - in_memory.means).max()))
print("largest difference of the covariances:", float(np.abs(on_disk.covars - in_memory.covars).max()))


# %%
# The log-likelihood after each iteration, the same for both.
fig, ax = plt.subplots(figsize=(5.5, 3.5))
ax.plot(np.array(on_disk.last_train.loglik_trace) / N, "o-", label="memmap (streamed)")
ax.plot(np.array(in_memory.last_train.loglik_trace) / N, "x--", ms=9, label="in memory")
ax.set_xlabel("EM iteration")
ax.set_ylabel("log-likelihood per event")
ax.legend()
fig.tight_layout()
plt.show()

del Xm
folder.cleanup()
