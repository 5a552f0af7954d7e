"""Many small GMMs in one call (asp_gmm.train_many) against one train() call each, and gmm-gpu.

    python3 benchmarks/batch.py [--backend c|cuda] [--cases diar,gmmgpu] [--repeats 5] [--json out.json]

Cases (every time a median of ``--repeats`` warm calls, after the history has explored: each case
first runs ``--warm`` calls that are not timed):

* ``diar``: a diarization-like batch: 32 models of D=19, M=8 and M=16, diag and full covariance,
  2 000-20 000 events each (log-uniform, fixed seed), 5 EM iterations from given parameters. Whole
  calls as a user writes them: ``train_many(models, datasets)`` against ``[g.train(X) for ...]``.
* ``gmmgpu``: gmm-gpu's own shape: 1 000 problems of 400 2-D points, K=2, full covariance, 10 EM
  iterations from given parameters (tol 0). asp_gmm one call each, asp_gmm batched, and gmm-gpu
  (``gmm_gpu.gmm.GMM(...).fit`` on a (1000, 400, 2) CUDA tensor, when installed and a GPU exists),
  with the largest relative error of the covariances against float64 EM (asp_gmm/reference.py).
  The batched call is timed twice: ``train_many`` on 1 000 GMM objects, and one ``GMMBatch`` (the
  array form: parameters and results as (1000, ...) arrays; made inside the clock, as gmm-gpu's
  model is).

The data is float32, the models fresh per call (same initial parameters, made before the clock:
``create_models_ms`` says what making the 1 000 GMM objects costs). Prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def diar_batch(rng, M, cvtype, B=32, D=19):
    Ns = np.exp(rng.uniform(np.log(2000), np.log(20000), B)).astype(int)
    data, params = [], []
    for n in Ns:
        centres = rng.normal(0, 2, (M, D))
        lab = rng.integers(0, M, n)
        X = (centres[lab] + rng.standard_normal((n, D))).astype(np.float32)
        data.append(X)
        params.append(_init(rng, X, M, cvtype))
    return data, params


def _init(rng, X, M, cvtype):
    N, D = X.shape
    mu = X[rng.choice(N, M, replace=False)].astype(np.float64)
    cov = np.atleast_2d(np.cov(X.astype(np.float64), rowvar=False, bias=True)) + 1e-3 * np.eye(D)
    cv = np.repeat(cov[None], M, 0) if cvtype == "full" else np.repeat(np.diag(cov)[None], M, 0)
    return np.full(M, 1.0 / M), mu, cv


def models(params, cvtype, backend):
    from asp_gmm import GMM

    D = params[0][1].shape[1]
    return [
        GMM(len(w), D, means=mu, covars=cv, weights=w, cvtype=cvtype, dtype=np.float32, backend=backend)
        for w, mu, cv in params
    ]


#: untimed calls at most, while the selection still explores (see :func:`time_calls`)
MAX_WARM = 60


def _explored(arg) -> bool:
    """Whether the last call on ``arg`` (a list of models) explored a configuration."""
    if not isinstance(arg, list):
        return False
    return any(getattr(getattr(g, "last_train", None), "explored", None) for g in arg)


def _compiles_done() -> bool:
    """Whether no candidate is compiling in the background: the next calls explore what they
    compile, and a compile beside small calls slows them (see ``asp_gmm.backends.c.threads_for``)."""
    from asp_gmm.runtime import default_runtime

    return default_runtime().compiles_running == 0


def time_calls(fn, repeats, warm, setup=lambda: None):
    """Median seconds of ``fn(setup())``; ``setup`` (the models with their initial parameters) is
    not timed. First ``warm`` untimed calls, then more (up to :data:`MAX_WARM`) until a call's
    models explored nothing and no candidate compiles in the background: one call each of 32
    models of different N is 32 classes on a fresh history, which explore for more than 4 calls,
    and a baseline timed while it explores or compiles is slow for a reason the comparison is not
    about."""
    for k in range(MAX_WARM):
        arg = setup()
        fn(arg)
        if k + 1 >= warm and not _explored(arg) and _compiles_done():
            break
    time_calls.warm_calls = k + 1
    ts = []
    for _ in range(repeats):
        arg = setup()
        t0 = time.perf_counter()
        fn(arg)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def case_diar(backend, repeats, warm, rows):
    from asp_gmm import train_many

    rng = np.random.default_rng(35)
    for cvtype in ("diag", "full"):
        for M in (8, 16):
            data, params = diar_batch(rng, M, cvtype)
            it = 5

            def setup():
                return models(params, cvtype, backend)

            def one_each(gs):
                for g, X in zip(gs, data):
                    g.train(X, min_em_iters=it, max_em_iters=it, tol=0.0)

            def batched(gs):
                train_many(gs, data, min_em_iters=it, max_em_iters=it, tol=0.0)
                batched.variant = gs[0].last_variant

            t1 = time_calls(one_each, repeats, warm, setup)
            w1 = time_calls.warm_calls
            tb = time_calls(batched, repeats, warm, setup)
            rows.append(
                dict(
                    case=f"diar 32x D=19 M={M} {cvtype} 2k-20k, 5 it",
                    one_each_ms=1e3 * t1,
                    batched_ms=1e3 * tb,
                    speedup=t1 / tb,
                    variant=batched.variant,
                    warm_calls=(w1, time_calls.warm_calls),
                )
            )
            print(rows[-1], flush=True)


def case_gmmgpu(backend, repeats, warm, rows, n_one_each=1000):
    from asp_gmm import GMMBatch, train_many
    from asp_gmm import reference as ref

    rng = np.random.default_rng(400)
    P, N, D, K, it = 1000, 400, 2, 2, 10
    centres = rng.normal(0, 3, (P, K, D))
    lab = rng.integers(0, K, (P, N))
    X = (np.take_along_axis(centres, lab[..., None], 1) + rng.standard_normal((P, N, D))).astype(np.float32)
    params = [_init(rng, X[p], K, "full") for p in range(P)]
    data = [X[p] for p in range(P)]

    def one_each(gs):
        for g, x in zip(gs, data[:n_one_each]):
            g.train(x, min_em_iters=it, max_em_iters=it, tol=0.0)

    out = {}

    def batched(gs):
        train_many(gs, X, min_em_iters=it, max_em_iters=it, tol=0.0)  # the (1000, 400, 2) array
        out["models"] = gs

    t1 = time_calls(one_each, max(1, repeats // 2), 1, lambda: models(params[:n_one_each], "full", backend))
    t1 *= P / n_one_each
    t0 = time.perf_counter()
    models(params, "full", backend)
    t_create = time.perf_counter() - t0
    tb = time_calls(batched, repeats, warm, lambda: models(params, "full", backend))
    # the array form: one GMMBatch of the 1 000 problems (made inside the clock, as gmm-gpu's model)
    W, MU, CV = (np.stack([p[i] for p in params]) for i in range(3))

    def stacked(_):
        gb = GMMBatch(P, K, D, means=MU, covars=CV, weights=W, cvtype="full", backend=backend)
        gb.train(X, min_em_iters=it, max_em_iters=it, tol=0.0)
        out["batch"] = gb

    ts = time_calls(stacked, repeats, warm)
    # and on a (1000, 400, 2) CUDA tensor, as gmm-gpu is given its data (checked and copied on the GPU)
    td = None
    if backend == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                Xt = torch.from_numpy(X).cuda()

                def on_device(_):
                    gb = GMMBatch(P, K, D, means=MU, covars=CV, weights=W, cvtype="full", backend=backend)
                    gb.train(Xt, min_em_iters=it, max_em_iters=it, tol=0.0)

                td = time_calls(on_device, repeats, warm)
        except ImportError:
            pass
    # accuracy against float64 EM (first 50 problems)
    err = err_s = 0.0
    for p in range(50):
        w, mu, cv = params[p]
        r = ref.em(data[p].astype(np.float64), w, mu, cv, "full", 1e-6, it, it, 0.0)
        g = out["models"][p]
        err = max(err, float(np.max(np.abs(g.covars - r["covars"])) / np.max(np.abs(r["covars"]))))
        err_s = max(err_s, float(np.max(np.abs(out["batch"].covars[p] - r["covars"])) / np.max(np.abs(r["covars"]))))
    row = dict(
        case="gmm-gpu shape 1000x400 D=2 K=2 full, 10 it",
        one_each_ms=1e3 * t1,
        batched_ms=1e3 * tb,
        speedup=t1 / tb,
        variant=out["models"][0].last_variant,
        cov_rel_err=err,
        create_models_ms=1e3 * t_create,
        gmmbatch_ms=1e3 * ts,
        gmmbatch_tensor_ms=None if td is None else 1e3 * td,
        gmmbatch_cov_rel_err=err_s,
    )
    peer = gmm_gpu_time(X, params, it, repeats)
    if peer is not None:
        row["gmm_gpu_ms"], row["gmm_gpu_cov_rel_err"] = peer[0], _peer_err(peer[1], data, params, it)
        row["gmm_gpu_means_rel_err"] = _peer_err(peer[2], data, params, it, "means")
        row["vs_gmm_gpu"] = peer[0] / row["batched_ms"]
        row["gmmbatch_vs_gmm_gpu"] = peer[0] / row["gmmbatch_ms"]
        if td is not None:
            row["gmmbatch_tensor_vs_gmm_gpu"] = peer[0] / row["gmmbatch_tensor_ms"]
    rows.append(row)
    print(row, flush=True)


def gmm_gpu_time(X, params, it, repeats):
    """gmm-gpu's fit on the (P, N, D) CUDA tensor, ms (median; synchronised), and its covariances."""
    try:
        import torch
        from gmm_gpu.gmm import GMM as GG
    except ImportError as exc:
        print(f"gmm-gpu not measured: {exc}", flush=True)
        return None
    if not torch.cuda.is_available():
        print("gmm-gpu not measured: no CUDA device", flush=True)
        return None
    dev = "cuda"
    Xt = torch.from_numpy(X).to(dev)
    w = torch.tensor(np.stack([p[0] for p in params]), dtype=torch.float32, device=dev)
    mu = torch.tensor(np.stack([p[1] for p in params]), dtype=torch.float32, device=dev)
    prec = torch.tensor(np.linalg.inv(np.stack([p[2] for p in params])), dtype=torch.float32, device=dev)
    ts, model = [], None
    for r in range(repeats + 2):
        # fresh copies each fit: gmm-gpu keeps views of the initial tensors as its parameters and
        # its M-step writes them in place (the next fit would start where the last one ended)
        w0, mu0, prec0 = w.clone(), mu.clone(), prec.clone()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        model = GG(
            n_components=mu.shape[1],
            max_iter=it,
            device=dev,
            tol=0.0,
            means_init=mu0,
            weights_init=w0,
            precisions_init=prec0,
        )
        model.fit(Xt)
        torch.cuda.synchronize()
        if r >= 2:
            ts.append(time.perf_counter() - t0)
    cov = getattr(model, "covariances_", None)
    if cov is None and getattr(model, "covs", None) is not None:  # gmm-gpu: one (B, D, D) tensor per component
        cov = torch.stack(list(model.covs), 1)
    cov = cov.detach().cpu().numpy() if cov is not None and hasattr(cov, "detach") else cov
    mu = getattr(model, "means", None)  # gmm-gpu: one (B, D) tensor per component
    mu = torch.stack(list(mu), 1).detach().cpu().numpy() if isinstance(mu, (list, tuple)) else None
    return 1e3 * statistics.median(ts), cov, mu


def _peer_err(got, data, params, it, what="covars"):
    """The largest relative error of the peer's ``what`` (first 50 problems) against float64 EM."""
    if got is None:
        return float("nan")
    from asp_gmm import reference as ref

    err = 0.0
    for p in range(50):
        w, mu, cv = params[p]
        r = ref.em(data[p].astype(np.float64), w, mu, cv, "full", 1e-6, it, it, 0.0)
        err = max(err, float(np.max(np.abs(got[p] - r[what])) / np.max(np.abs(r[what]))))
    return err


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="c")
    ap.add_argument("--cases", default="diar,gmmgpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warm", type=int, default=4, help="untimed calls first (the history explores)")
    ap.add_argument("--one-each", type=int, default=1000, help="gmmgpu: problems timed one call each (scaled)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    rows = []
    for case in a.cases.split(","):
        if case == "diar":
            case_diar(a.backend, a.repeats, a.warm, rows)
        elif case == "gmmgpu":
            case_gmmgpu(a.backend, a.repeats, a.warm, rows, a.one_each)
        else:
            raise SystemExit(f"unknown case {case!r}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"\nbackend {a.backend}; medians of {a.repeats} warm calls")
    print(f"{'case':48s} {'one each ms':>12s} {'batched ms':>11s} {'x':>6s}  variant / peer")
    for r in rows:
        extra = r["variant"]
        if "gmm_gpu_ms" in r:
            extra += f"; gmm-gpu {r['gmm_gpu_ms']:.1f} ms (x{r['vs_gmm_gpu']:.1f}), err {r['gmm_gpu_cov_rel_err']:.1e}"
            extra += f" (means {r.get('gmm_gpu_means_rel_err', float('nan')):.1e})"
        if "cov_rel_err" in r:
            extra += f"; asp err {r['cov_rel_err']:.1e}"
        print(f"{r['case']:48s} {r['one_each_ms']:12.1f} {r['batched_ms']:11.1f} {r['speedup']:6.1f}  {extra}")
        if "gmmbatch_ms" in r:
            x = r["one_each_ms"] / r["gmmbatch_ms"]
            extra = f"GMMBatch (made in the clock); asp err {r['gmmbatch_cov_rel_err']:.1e}"
            if "gmmbatch_vs_gmm_gpu" in r:
                extra += f"; x{r['gmmbatch_vs_gmm_gpu']:.1f} vs gmm-gpu"
            print(f"{'  the same as one GMMBatch':48s} {'':12s} {r['gmmbatch_ms']:11.1f} {x:6.1f}  {extra}")
        if r.get("gmmbatch_tensor_ms"):
            x = r["one_each_ms"] / r["gmmbatch_tensor_ms"]
            extra = "GMMBatch on the CUDA tensor"
            if "gmmbatch_tensor_vs_gmm_gpu" in r:
                extra += f"; x{r['gmmbatch_tensor_vs_gmm_gpu']:.1f} vs gmm-gpu"
            print(
                f"{'  the same, X a torch CUDA tensor':48s} {'':12s} {r['gmmbatch_tensor_ms']:11.1f} {x:6.1f}  {extra}"
            )


if __name__ == "__main__":
    main()
