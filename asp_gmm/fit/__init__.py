"""The fitting wing: one data layer, one seeding, one pass loop under every entry.

``GMM.train`` and the drop-in ``GaussianMixture`` check their arguments, decide the data's kind once
(:func:`data.as_data`), seed what is missing (:mod:`.seed`) and hand the call to the specializer,
which runs the backend's compiled loop or the pass loop (:func:`passes.em`) for chunk sources, data
beyond the device budget and weighted fits.

Modules, each one job:

``data``
    :func:`~.data.as_data` (host array, CUDA array, chunk source) and the validation of X.
``sources``
    Chunk sources, fixed-size blocks, sample weights as an aligned source
    (:func:`~.sources.as_weights`, :func:`~.sources.weighted_blocks`, :func:`~.sources.check_weights`),
    the device budget.
``stats``
    :class:`~.stats.SuffStats`: compensated float64 sufficient statistics; ``add``, ``scaled``,
    ``recentred`` and the M-step from statistics (:meth:`~.stats.SuffStats.mstep`).
``seed``
    The one seeding (event indices by cumulative weight, covariances, the zero-variance check),
    from sums or from a source.
``passes``
    The pass loop on :func:`asp_gmm.reference.converged`, the progress bar, one pass's statistics.
``result``
    :class:`~.result.TrainResult`, what every entry returns.
``numpy_em``, ``init``, ``online``, ``checks``, ``dropin``
    The drop-in's float64 numerics, initialisations, online EM, parameter checks, and its loops on
    the specializer.

For a distributed loop (one task per worker, only the model exchanged): each worker computes
:class:`~.stats.SuffStats` of its rows with :func:`passes.pass_stats` (a runner from
``backend.open_stats`` or, with weights, ``backend.open_weighted_stats``); the client adds them
(:meth:`SuffStats.add`, re-centring where the centres differ), takes the M-step
(:meth:`SuffStats.mstep`), tests :func:`asp_gmm.reference.converged` on
:func:`asp_gmm.reference.change_per_event` of ``loglik`` over ``n`` (the total weight with sample
weights), and returns a :class:`~.result.TrainResult`. Seeding over sums: per worker the count, the
sums of ``x - shift`` and of its outer products (:func:`seed.moments_from_sums` turns the total into
the mean and covariance; :func:`seed.event_index` picks the events for the means;
:func:`seed.covariances` and :func:`seed.check_covariances` finish them).
"""
