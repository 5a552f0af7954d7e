#!/usr/bin/env python3
"""Speaker diarization ("who spoke when") with agglomerative GMM clustering on asp_gmm.

    python examples/diarization/diarize.py AUDIO --rttm OUT.rttm [--ref REF.rttm]
        [--backend auto|c|cuda|numpy|sklearn] [--plot OUT.png]

Reads WAV/FLAC (any rate, stereo mixed down), extracts 19 MFCCs (25 ms / 10 ms), drops non-speech
(energy-based), clusters the speech frames with ICSI/PyCASP agglomerative GMM clustering, writes an
RTTM and prints the number of speakers, the processing time and the x-realtime factor
(audio seconds / processing seconds, from reading the audio to writing the RTTM, features
included; library imports and the specializer's one-time compilation are done before the clock
starts and are shown separately). With --ref it prints the DER (pyannote.metrics, +-0.25 s
collar as NIST md-eval).

Try it on the bundled meeting:

    python examples/diarization/diarize.py examples/diarization/data/meeting.flac \
        --ref examples/diarization/data/meeting.rttm --rttm /tmp/meeting.rttm
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from features import FRAME_RATE, DiarizationError  # noqa: E402


def build_parser():
    ap = argparse.ArgumentParser(
        prog="diarize.py", description="Speaker diarization with agglomerative GMM clustering.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("audio", help="input audio (WAV, FLAC, ...)")
    ap.add_argument("--rttm", required=True, help="output RTTM")
    ap.add_argument("--ref", help="reference RTTM: print the DER")
    ap.add_argument("--backend", default="auto", choices=["auto", "c", "cuda", "numpy", "sklearn"],
                    help="GMM implementation; auto = asp_gmm's best, or scikit-learn without asp_gmm")
    ap.add_argument("--plot", help="write a PNG timeline of reference and hypothesis speakers")
    g = ap.add_argument_group("clustering (defaults: the ICSI/PyCASP seed)")
    g.add_argument("--clusters", type=int, default=16, help="initial clusters")
    g.add_argument("--components", type=int, default=5, help="Gaussians per initial cluster")
    g.add_argument("--segment", type=int, default=150,
                   help="majority-vote length, frames of 10 ms (the seed: 250)")
    g.add_argument("--em-iters", type=int, default=3, help="EM iterations per training")
    g.add_argument("--cvtype", default="diag", choices=["diag", "full"], help="covariance type")
    g.add_argument("--seg-loops-init", type=int, default=2, help="resegmentations before merging")
    g.add_argument("--seg-loops", type=int, default=3, help="resegmentations per merge round")
    g.add_argument("--reg-covar", type=float, default=1e-3, help="covariance floor")
    g.add_argument("--vote", default="sliding", choices=["sliding", "block"],
                   help="resegmentation vote: fixed blocks of --segment frames (the seed) or a "
                        "window of --segment frames centred on every frame")
    g.add_argument("--frames-per-component", type=int, default=200,
                   help="a cluster's Gaussians follow its data: frames/this, between --components "
                        "and --max-model-components (0: fixed, merged models keep M1+M2 as the seed)")
    g.add_argument("--max-model-components", type=int, default=32,
                   help="most Gaussians a cluster model gets from --frames-per-component")
    g2 = ap.add_argument_group("output")
    g2.add_argument("--final", default="sliding", choices=["sliding", "block"],
                    help="final labels: sliding-window vote of the final models, or the seed's block vote")
    g2.add_argument("--merge-gap", type=float, default=0.5,
                    help="join same-speaker segments separated by a pause shorter than this (s)")
    g2.add_argument("--vad-threshold", type=float, default=0.35,
                    help="speech threshold between noise floor (0) and speech level (1)")
    ap.add_argument("--jobs", type=int, default=0,
                    help="threads for independent GMM calls (clusters, BIC pairs); 0: one per CPU "
                         "core on asp_gmm's CPU backends (each call then runs on one thread), "
                         "1 on CUDA and scikit-learn")
    ap.add_argument("--seed", type=int, default=0, help="seed passed to every GMM")
    ap.add_argument("-v", "--verbose", action="store_true", help="print every merge round")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def warm_up_features():
    """Import librosa's lazily loaded submodules and let numba load its compiled helpers (2-4 s on
    the first call in a process) before the clock starts, by computing features of 3 s of noise."""
    import numpy as np
    from features import compute_features
    compute_features(np.random.default_rng(0).standard_normal(48000).astype(np.float32), 16000)


def warm_up_gmm(backend_name: str, params, n_frames: int = 10_000):
    """Let the GMM implementation load (and asp_gmm compile or load the code for every model size
    the clustering can reach) before the clock runs."""
    import numpy as np
    from cluster import Backend
    be = Backend(backend_name)
    be.prepare(19, range(1, params.max_components + 1), n_frames, params.cvtype, params.dtype)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 19)).astype(params.dtype)
    g1 = be.GMM(params.n_components, 19, cvtype=params.cvtype, dtype=params.dtype,
                reg_covar=params.reg_covar)
    g2 = be.GMM(params.n_components, 19, cvtype=params.cvtype, dtype=params.dtype,
                reg_covar=params.reg_covar)
    g1.train(X[:300], min_em_iters=params.em_iters, max_em_iters=params.em_iters)
    g2.train(X[300:], min_em_iters=params.em_iters, max_em_iters=params.em_iters)
    g1.score(X)
    be.bic(g1, g2, X, params.em_iters)
    return be


def check_audio_file(path, seg_len):
    """Fail fast (before the slow imports) on a missing, unreadable, empty or too short file."""
    import soundfile as sf
    p = Path(path)
    if not p.exists():
        raise DiarizationError(f"{path}: no such file")
    if p.is_dir():
        raise DiarizationError(f"{path}: is a directory, not an audio file")
    try:
        info = sf.info(str(p))
    except Exception as e:  # libsndfile's message says what is wrong with the file
        raise DiarizationError(f"{path}: cannot read audio ({e})") from None
    if info.frames <= 0:
        raise DiarizationError(f"{path}: the file contains no audio samples")
    if info.frames / info.samplerate * FRAME_RATE < seg_len:
        raise DiarizationError(f"{path}: {info.frames / info.samplerate:.2f} s of audio is shorter "
                               f"than one voting segment ({seg_len / FRAME_RATE:.2f} s)")


def default_jobs(backend_name: str) -> int:
    """One thread per core on asp_gmm's CPU backends; CUDA calls stay on the main thread, and so
    do scikit-learn's (it holds the GIL in Python code and threads its BLAS itself: a pool made
    it 3-7x slower on 2 cores)."""
    if backend_name in ("cuda", "sklearn"):
        return 1
    if backend_name == "auto":
        try:
            import pycuda.driver  # noqa: F401  (auto takes CUDA where pycuda and a GPU exist)
            return 1
        except Exception:
            pass
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(8, n))


def resolve_backend(name: str) -> str:
    if name != "auto":
        return name
    try:
        import asp_gmm  # noqa: F401
        return "auto"
    except ImportError:
        return "sklearn"


def params_from_args(args):
    from cluster import ClusterParams
    return ClusterParams(n_init=args.clusters, n_components=args.components, seg_len=args.segment,
                         em_iters=args.em_iters, cvtype=args.cvtype,
                         seg_loops_init=args.seg_loops_init, seg_loops=args.seg_loops,
                         reg_covar=args.reg_covar, vote=args.vote,
                         frames_per_component=args.frames_per_component,
                         max_model_components=args.max_model_components,
                         n_jobs=max(1, args.jobs))


def diarize(audio_path, args, log=print):
    """Returns a dict with segments, timings and counts. Raises DiarizationError on bad input."""
    import numpy as np
    from cluster import Clusterer
    from features import compute_features, load_audio
    from rttm import labels_to_segments

    params = params_from_args(args)
    backend_name = resolve_backend(args.backend)
    check_audio_file(audio_path, params.seg_len)
    if args.jobs == 0:
        params.n_jobs = default_jobs(backend_name)
    if params.n_jobs > 1 and backend_name != "sklearn":
        # Parallel over clusters and pairs, so each asp_gmm call should use one thread (its
        # documented setting; read once, before the first call).
        os.environ.setdefault("ASP_GMM_NUM_THREADS", "1")
    t0 = time.perf_counter()
    warm_up_features()
    t_warm = time.perf_counter() - t0

    t_start = time.perf_counter()
    x, sr = load_audio(audio_path)
    duration = len(x) / sr
    t_load = time.perf_counter()
    feats = compute_features(x, sr, vad_threshold=args.vad_threshold)
    t_feat = time.perf_counter()
    n_speech = int(feats.speech.sum())
    if n_speech == 0:
        raise DiarizationError(f"{audio_path}: no speech found (silence or stationary noise only)")
    if n_speech < params.seg_len:
        raise DiarizationError(f"{audio_path}: only {n_speech / FRAME_RATE:.2f} s of speech, less "
                               f"than one voting segment ({params.seg_len / FRAME_RATE:.2f} s)")
    # The one-time loading/compilation of the GMM code is not part of the processing time.
    t0 = time.perf_counter()
    be = warm_up_gmm(backend_name, params, n_speech)
    t_gmm_warm = time.perf_counter() - t0
    t_warm += t_gmm_warm
    Xs = feats.mfcc[feats.speech]
    clus = Clusterer(Xs, be, params, log=log if args.verbose else None, seed=args.seed)
    clus.run()
    lab = clus.final_labels(args.final)
    t_clus = time.perf_counter() - t_gmm_warm
    # Name speakers by order of first appearance.
    uniq, first_idx = np.unique(lab, return_index=True)
    rank = np.empty(len(uniq), int)
    rank[np.argsort(first_idx)] = np.arange(len(uniq))
    full = np.full(len(feats.speech), -1)
    full[feats.speech] = rank[np.searchsorted(uniq, lab)]
    segments = labels_to_segments(full, FRAME_RATE, merge_gap=args.merge_gap)
    t_end = time.perf_counter() - t_gmm_warm
    return {
        "segments": segments, "n_speakers": len(uniq), "duration": duration,
        "speech_seconds": n_speech / FRAME_RATE, "backend": be.name, "clusterer": clus,
        "times": {"warmup": t_warm, "load": t_load - t_start, "features": t_feat - t_load,
                  "clustering": t_clus - t_feat, "output": t_end - t_clus,
                  "total": t_end - t_start},
    }


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _main(args)
    except DiarizationError as e:
        print(f"diarize.py: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # an internal failure: one line unless --debug
        if args.debug:
            raise
        print(f"diarize.py: internal error: {type(e).__name__}: {e} (run with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


def _main(args) -> int:
    from rttm import der, plot_timeline, read_rttm, write_rttm
    audio = Path(args.audio)
    uri = audio.stem
    ref = None
    if args.ref:  # check the reference before spending time on the audio
        refs = read_rttm(args.ref)
        ref = refs.get(uri) or (next(iter(refs.values())) if len(refs) == 1 else None)
        if ref is None:
            raise DiarizationError(f"{args.ref}: no SPEAKER lines for '{uri}' (has: {', '.join(refs)})")
    out_dir = Path(args.rttm).resolve().parent
    if not out_dir.is_dir():
        raise DiarizationError(f"{args.rttm}: directory {out_dir} does not exist")
    r = diarize(audio, args)
    write_rttm(args.rttm, uri, r["segments"])
    t = r["times"]
    c = r["clusterer"].prof
    print(f"{audio.name}: {r['duration']:.1f} s of audio, {r['speech_seconds']:.1f} s of speech, "
          f"backend {r['backend']}, {r['clusterer'].p.n_jobs} thread(s)")
    print(f"speakers found: {r['n_speakers']}")
    print(f"processing time: {t['total']:.3f} s (read {t['load']:.3f}, features {t['features']:.3f}, "
          f"clustering {t['clustering']:.3f} [train {c.seconds['train']:.3f}, score "
          f"{c.seconds['score']:.3f}, BIC pairs {c.seconds['bic']:.3f} x{c.calls['bic']}, python "
          f"{c.other:.3f}]); warm-up/compile before the clock {t['warmup']:.2f} s")
    print(f"x-realtime: {r['duration'] / t['total']:.1f}")
    if ref is not None:
        d = der(ref, r["segments"], uri, duration=r["duration"])
        tot = d["total"] or 1.0
        print(f"DER: {100 * d['der']:.2f} % (missed {100 * d['missed detection'] / tot:.2f} %, "
              f"false alarm {100 * d['false alarm'] / tot:.2f} %, confusion "
              f"{100 * d['confusion'] / tot:.2f} %; collar +-0.25 s, {len({s[2] for s in ref})} "
              "reference speakers)")
    if args.plot:
        plot_timeline(args.plot, ref, r["segments"], title=f"{audio.name}: reference (top) and "
                      f"hypothesis ({r['n_speakers']} speakers, backend {r['backend']})")
        print(f"timeline written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
