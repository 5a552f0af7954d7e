"""
Choosing the number of components by BIC
========================================

Fit :class:`asp_gmm.GaussianMixture` for M = 1 ... 8 components and keep the model of lowest
Bayesian information criterion (:meth:`~asp_gmm.GaussianMixture.bic`), for both covariance types.
Each fit runs on the specialized EM core; the loop is plain scikit-learn code.
"""

import matplotlib.pyplot as plt
import numpy as np

from asp_gmm import GaussianMixture

rng = np.random.default_rng(3)
true_M, D = 4, 3
centres = rng.normal(0, 5, (true_M, D))
X = np.concatenate([c + rng.normal(size=(1000, D)) @ rng.normal(0, 0.6, (D, D)) for c in centres])

orders = range(1, 9)
bic = {}
for cvtype in ("full", "diag"):
    bic[cvtype] = [GaussianMixture(M, covariance_type=cvtype, random_state=0).fit(X).bic(X) for M in orders]
    best = orders[int(np.argmin(bic[cvtype]))]
    print(f"{cvtype}: lowest BIC at M = {best}")

# %%
# The full covariances find the four clusters; diagonal ones need more components to describe the
# same correlated clusters.
fig, ax = plt.subplots(figsize=(5.5, 3.8))
for cvtype, marker in (("full", "o-"), ("diag", "s--")):
    ax.plot(list(orders), bic[cvtype], marker, label=f'covariance_type="{cvtype}"')
ax.axvline(true_M, color="grey", lw=0.8)
ax.set_xlabel("components M")
ax.set_ylabel("BIC (lower is better)")
ax.legend()
fig.tight_layout()
plt.show()
