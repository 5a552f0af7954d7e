"""
The scikit-learn drop-in in a pipeline
======================================

:class:`asp_gmm.GaussianMixture` takes scikit-learn's parameters and offers its methods and
attributes, so it goes wherever ``sklearn.mixture.GaussianMixture`` goes: here behind a scaler in a
:class:`~sklearn.pipeline.Pipeline`, tuned by :class:`~sklearn.model_selection.GridSearchCV`. The one
change is the import.
"""

import matplotlib.pyplot as plt
import numpy as np
from sklearn.datasets import load_iris
from sklearn.metrics import adjusted_rand_score
from sklearn.mixture import GaussianMixture as SkGaussianMixture
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from asp_gmm import GaussianMixture  # instead of: from sklearn.mixture import GaussianMixture

X, species = load_iris(return_X_y=True)
pipe = make_pipeline(StandardScaler(), GaussianMixture(n_components=3, random_state=0))
labels = pipe.fit(X).predict(X)
print(f"agreement of the 3 clusters with the species (adjusted Rand index): {adjusted_rand_score(species, labels):.3f}")

fig, axes = plt.subplots(1, 2, figsize=(8, 3.5), sharey=True)
for ax, colour, title in ((axes[0], species, "species"), (axes[1], labels, "clusters of the pipeline")):
    ax.scatter(X[:, 2], X[:, 3], c=colour, cmap="viridis", s=12)
    ax.set_title(title)
    ax.set_xlabel("petal length (cm)")
axes[0].set_ylabel("petal width (cm)")
fig.tight_layout()
plt.show()

# %%
# ``GridSearchCV`` clones the estimator for every fold and ranks the candidates by its ``score``
# (the held-out mean log-likelihood per sample), as it does for scikit-learn's own mixture.
grid = {"gaussianmixture__covariance_type": ["full", "diag"], "gaussianmixture__n_components": [2, 3, 4]}
search = GridSearchCV(pipe, grid, cv=3).fit(X)
for params, s in zip(search.cv_results_["params"], search.cv_results_["mean_test_score"]):
    print(
        f"{params['gaussianmixture__covariance_type']:>4}, {params['gaussianmixture__n_components']} components: {s:7.3f}"
    )
print("best:", search.best_params_)

# %%
# Started from the same parameters, the drop-in reproduces scikit-learn's result.
Xs = StandardScaler().fit_transform(X)
ours = GaussianMixture(3, random_state=0).fit(Xs)
theirs = SkGaussianMixture(3, random_state=0).fit(Xs)
print(f"lower bound: asp_gmm {ours.lower_bound_:.6f}, scikit-learn {theirs.lower_bound_:.6f}")
print(f"iterations:  asp_gmm {ours.n_iter_}, scikit-learn {theirs.n_iter_}")
print("same labels:", np.array_equal(ours.predict(Xs), theirs.predict(Xs)))
