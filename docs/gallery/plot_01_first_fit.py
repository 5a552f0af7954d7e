"""
A first fit
===========

Fit a mixture of three Gaussians to two-dimensional data with :class:`asp_gmm.GMM`, look at what
the specializer chose (:attr:`asp_gmm.GMM.last_train`), and draw the components.
"""

import matplotlib.pyplot as plt
import numpy as np

from asp_gmm import GMM

rng = np.random.default_rng(0)
centres = np.array([[0.0, 0.0], [4.0, 1.0], [1.0, 5.0]])
X = np.concatenate([c + rng.normal(size=(2000, 2)) * s for c, s in zip(centres, (0.6, 1.0, 0.8))])

# %%
# Train: the first call seeds the parameters from the data, compiles (or loads from the cache) the
# variant chosen for this problem and runs EM in compiled code.
g = GMM(3, 2, cvtype="full", seed=0)
loglik = g.train(X, max_em_iters=50)
print(f"log-likelihood {loglik:.1f} after {g.n_iter} iterations, converged: {g.converged}")
print("weights", np.round(g.weights, 3))
print("means\n", np.round(g.means, 2))

# %%
# ``last_train`` says what ran and why (``reason``: "history", "explore", "predicted", "rule"...).
r = g.last_train
print(f"variant {r.variant}, reason {r.reason!r}, {r.seconds * 1e3:.1f} ms")

# %%
# The components as 2-sigma ellipses over the data, coloured by :meth:`asp_gmm.GMM.predict`.
labels = g.predict(X)
fig, ax = plt.subplots(figsize=(5, 4.5))
ax.scatter(X[:, 0], X[:, 1], c=labels, s=2, cmap="tab10", alpha=0.5)
t = np.linspace(0, 2 * np.pi, 100)
for mu, cov in zip(g.means, g.covars):
    vals, vecs = np.linalg.eigh(cov)
    ellipse = vecs @ (2 * np.sqrt(vals)[:, None] * np.array([np.cos(t), np.sin(t)]))
    ax.plot(mu[0] + ellipse[0], mu[1] + ellipse[1], "k-", lw=1.5)
ax.set_title("GMM(3, 2).train(X)")
ax.set_aspect("equal")
plt.show()
