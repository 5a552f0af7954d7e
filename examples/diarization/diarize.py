#!/usr/bin/env python3
"""Speaker diarization ("who spoke when") with Gaussian mixture models trained by asp_gmm.

    python examples/diarization/diarize.py AUDIO --rttm OUT.rttm [--ref REF.rttm]
        [--backend auto|c|cuda|numpy|sklearn] [--plot OUT.png]

Reads WAV/FLAC (any rate, stereo mixed down) and writes an RTTM:

1. features: 20 cepstra of a 40-band log-mel spectrum (25 ms / 10 ms, NumPy only);
2. speech activity: an energy detector bootstraps a speech GMM and a non-speech GMM that are
   re-trained on the recording (sad.py);
3. speakers: ICSI/PyCASP agglomerative clustering of the speech frames (c0..c19, 8-component
   GMMs, resegmentation with a 1.5 s vote, merging by compute_distance_BIC) that stops when the
   best merge's gain per frame falls below a threshold on the recording's own scale; optionally
   also when the two clusters' supervectors (a background GMM of the recording adapted to each)
   point apart, or on their cross-likelihood ratio per frame (cluster.py);
4. a final Viterbi resegmentation of the speech frames with the speakers' GMMs (reseg.py), then
   segments: pauses under 0.5 s inside a speaker's turn are that speaker's, no segment under 0.2 s;
   with --overlap-margin, a second speaker where the chosen one barely leads (overlap.py).

The defaults were chosen by leave-one-recording-out cross-validation over windows of real
recordings (benchmarks/diarization_cv.py).

It prints the number of speakers and two speeds: processing (reading the audio to the speaker
labels; the one-time loading of the GMM code is done before this clock) and end to end (from
the start of the Python process to the RTTM written, imports and warm-up included). With --ref
it prints the DER (pyannote.metrics, +-0.25 s collar as NIST md-eval).

Try it on the bundled meeting:

    python examples/diarization/diarize.py examples/diarization/data/meeting.flac \
        --ref examples/diarization/data/meeting.rttm --rttm /tmp/meeting.rttm
"""

from __future__ import annotations

import time

_T_SCRIPT = time.perf_counter()  # first statement: the end-to-end clock's fallback start

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from features import FRAME_RATE, N_FEATURES, DiarizationError  # noqa: E402


def process_age() -> float:
    """Seconds since this process started (interpreter start-up included), from the kernel's
    start time of the process; where /proc is missing, since the first line of this script."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = float(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        age = uptime - start_ticks / os.sysconf("SC_CLK_TCK")
        if 0.0 <= age < 86400.0:
            return age
    except (OSError, ValueError, IndexError):
        pass
    return time.perf_counter() - _T_SCRIPT


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, but not "(default: None)" for options without one."""

    def _get_help_string(self, action):
        if action.default is None or action.default is argparse.SUPPRESS or action.required:
            return action.help
        return super()._get_help_string(action)


def build_parser():
    ap = argparse.ArgumentParser(
        prog="diarize.py",
        description="Speaker diarization with Gaussian mixture models (asp_gmm).",
        formatter_class=_Formatter,
    )
    ap.add_argument("audio", help="input audio (WAV, FLAC, ...)")
    ap.add_argument("--rttm", required=True, help="output RTTM (required)")
    ap.add_argument("--ref", help="reference RTTM: print the DER")
    ap.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "c", "cuda", "numpy", "sklearn"],
        help="GMM implementation; auto = asp_gmm's best, or scikit-learn without asp_gmm",
    )
    ap.add_argument("--plot", help="write a PNG timeline of reference and hypothesis speakers")
    ap.add_argument(
        "--speakers",
        type=int,
        default=0,
        help="the number of speakers when it is known (0: found by the stopping rule)",
    )
    s = ap.add_argument_group("speech activity")
    s.add_argument(
        "--sad",
        default="gmm",
        choices=["gmm", "energy"],
        help="GMM speech/non-speech models bootstrapped from energy, or energy alone",
    )
    s.add_argument(
        "--vad-threshold",
        type=float,
        default=0.35,
        help="energy detector: threshold between noise floor (0) and speech level (1)",
    )
    s.add_argument(
        "--sad-bias",
        type=float,
        default=1.0,
        help="GMM detector: speech where the smoothed speech/non-speech log-likelihood ratio exceeds this",
    )
    s.add_argument(
        "--sad-level",
        default="band",
        choices=["band", "full"],
        help="the level the detectors start from: the speech band's (200 Hz - 8 kHz) or the whole spectrum's",
    )
    g = ap.add_argument_group("clustering")
    g.add_argument(
        "--first-cep",
        type=int,
        default=0,
        choices=[0, 1],
        help="features: cepstra from this one to c19 (0: with the level c0)",
    )
    g.add_argument("--clusters", type=int, default=16, help="initial clusters")
    g.add_argument("--components", type=int, default=8, help="Gaussians per cluster model")
    g.add_argument("--segment", type=int, default=150, help="majority-vote length, frames of 10 ms (the seed: 250)")
    g.add_argument("--em-iters", type=int, default=3, help="EM iterations per retraining")
    g.add_argument("--cvtype", default="diag", choices=["diag", "full"], help="covariance type")
    g.add_argument("--seg-loops-init", type=int, default=2, help="resegmentations before merging")
    g.add_argument("--seg-loops", type=int, default=3, help="resegmentations per merge round")
    g.add_argument("--reg-covar", type=float, default=1e-3, help="covariance floor")
    g.add_argument(
        "--vote",
        default="sliding",
        choices=["sliding", "block"],
        help="resegmentation vote: fixed blocks of --segment frames (the seed) or a "
        "window of --segment frames centred on every frame",
    )
    g.add_argument(
        "--frames-per-component",
        type=int,
        default=200,
        help="a cluster's Gaussians follow its data, frames/this, between --components "
        "and --max-model-components (0: merged models keep M1+M2 as the seed)",
    )
    g.add_argument(
        "--max-model-components",
        type=int,
        default=8,
        help="most Gaussians a cluster model gets (equal to --components: fixed size)",
    )
    g.add_argument(
        "--merge-rule",
        default="relative",
        choices=["relative", "per-frame", "bic"],
        help="stop merging when the best pair's gain per frame, on the recording's "
        "scale, is under --relative-threshold (relative); when the gain per frame "
        "is under --merge-threshold (per-frame); when the BIC score is <= 0 (bic, "
        "the seed)",
    )
    g.add_argument(
        "--relative-threshold",
        type=float,
        default=0.49,
        help="relative rule: 0 = a typical pair of two speakers' fragments, 1 = of one "
        "speaker's (first merge round); chosen on the development recordings",
    )
    g.add_argument(
        "--cosine-threshold",
        type=float,
        default=-1.0,
        help="no merge of a pair whose supervectors (the recording's background GMM "
        "adapted to each cluster) have a cosine under this; -1: no check",
    )
    g.add_argument(
        "--stop-rule",
        default="relative",
        choices=["relative", "clr"],
        help="stop merging on the relative gain (--relative-threshold) or on the best pair's "
        "cross-likelihood ratio per frame (--clr-threshold); the cosine check applies to both",
    )
    g.add_argument(
        "--clr-threshold",
        type=float,
        default=0.0,
        help="clr rule: no merge of a pair whose CLR per frame is under this",
    )
    g.add_argument("--ubm-components", type=int, default=12, help="Gaussians of the background GMM of the cosine check")
    g.add_argument(
        "--cosine-min-speech",
        type=float,
        default=5.0,
        help="the cosine check applies when both clusters hold this much speech (s)",
    )
    g.add_argument("--relevance", type=float, default=16.0, help="MAP relevance factor of the cluster supervectors")
    g.add_argument("--merge-threshold", type=float, default=-0.15, help="per-frame rule: nats per frame")
    g.add_argument(
        "--min-gain-per-frame",
        type=float,
        default=-0.25,
        help="relative rule: also stop when the best pair's gain per frame is under this (nats)",
    )
    g.add_argument(
        "--pre-iters", type=int, default=5, help="EM iterations of every cluster model before the pairs are scored"
    )
    g.add_argument("--bic-iters", type=int, default=0, help="EM iterations of a merged model (0: --em-iters)")
    o = ap.add_argument_group("output")
    o.add_argument(
        "--final",
        default="viterbi",
        choices=["viterbi", "sliding", "block"],
        help="final labels: Viterbi resegmentation with the final models, their "
        "sliding-window vote, or the seed's last block vote",
    )
    o.add_argument(
        "--overlap-margin",
        type=float,
        default=0.0,
        help="overlapped speech: a second speaker where the chosen one leads the runner-up by "
        "less than this (nats per frame, over 0.5 s); 0: one speaker per frame (overlap.py)",
    )
    o.add_argument("--penalty", type=float, default=40.0, help="Viterbi: cost of a change of speaker (nats)")
    o.add_argument("--min-run", type=float, default=0.3, help="Viterbi: shortest speaker run (s of speech)")
    o.add_argument(
        "--merge-gap",
        type=float,
        default=0.5,
        help="join same-speaker segments separated by a pause shorter than this (s)",
    )
    o.add_argument(
        "--min-segment",
        type=float,
        default=0.2,
        help="shortest segment written (s): shorter ones join a neighbour or are dropped",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=0,
        help="threads for independent GMM calls (clusters, BIC pairs); 0: one per CPU "
        "core on asp_gmm's CPU backends (each call then runs on one thread), "
        "1 on CUDA and scikit-learn",
    )
    ap.add_argument(
        "--seed", type=int, default=0, help="seed of the initial cluster models (random distinct frames as means)"
    )
    ap.add_argument("-v", "--verbose", action="store_true", help="print every merge round")
    ap.add_argument("--debug", action="store_true", help="show tracebacks")
    return ap


def warm_up_gmm(backend_name: str, params, D: int = N_FEATURES, made=None):
    """Let the GMM implementation load (asp_gmm: open its tuning history, compile or load the code
    for the model sizes the run uses) before the processing clock runs; ``made`` (a Future), when
    given, receives the backend object as soon as it exists, before the loading."""
    import numpy as np
    from cluster import Backend

    be = Backend(backend_name)
    if made is not None:
        made.set_result(be)
    # the background model is trained only for the cosine check and the CLR stop rule
    background = params.cosine_threshold > -1.0 or params.stop_rule == "clr"
    be.prepare(
        D,
        sorted(
            {params.n_components, params.max_components, 8, 16} | ({params.ubm_components} if background else set())
        ),
        10_000,
        params.cvtype,
        params.dtype,
        # a batched run trains and scores its clusters in batched calls: single calls of this D are
        # made only by the background model
        single=background,
    )
    if be.batched:
        # prepare() has loaded every binary the run calls and opened the tuning history; toy EM
        # calls here would only add shapes of their own to the history, each planned (and, while
        # not fully measured, predicted by a cost model fitted to the whole history: 2 s of a
        # cached run's warm-up on a shared history) for nothing the run uses
        return be
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, D)).astype(params.dtype)
    g1 = be.GMM(params.n_components, D, cvtype=params.cvtype, dtype=params.dtype, reg_covar=params.reg_covar)
    g2 = be.GMM(params.n_components, D, cvtype=params.cvtype, dtype=params.dtype, reg_covar=params.reg_covar)
    g1.train(X[:300], min_em_iters=params.em_iters, max_em_iters=params.em_iters)
    g2.train(X[300:], min_em_iters=params.em_iters, max_em_iters=params.em_iters)
    g1.score(X)
    if params.cosine_threshold > -1.0:
        ubm = be.GMM(params.ubm_components, D, cvtype="diag", dtype=params.dtype, reg_covar=params.reg_covar)
        ubm.train(X, min_em_iters=1, max_em_iters=1)
        ubm.eval(X)
    be.bic(g1, g2, X, params.em_iters)
    return be


def check_audio_file(path, seg_len):
    """Fail fast (before the slow work) on a missing, unreadable, empty or too short file."""
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
        raise DiarizationError(
            f"{path}: {info.frames / info.samplerate:.2f} s of audio is shorter "
            f"than one voting segment ({seg_len / FRAME_RATE:.2f} s)"
        )


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
    """``name``, or for "auto" the implementation the run will use: asp_gmm where it is installed
    or this is its source checkout, else scikit-learn. Only looked up, not imported: the import
    (50 ms) belongs to the warm-up thread, which runs beside the audio's reading and features."""
    if name != "auto":
        return name
    from importlib.util import find_spec

    if find_spec("asp_gmm") is not None or (HERE.parents[1] / "asp_gmm" / "__init__.py").is_file():
        return "auto"
    return "sklearn"


def params_from_args(args):
    from cluster import ClusterParams

    return ClusterParams(
        n_init=args.clusters,
        n_components=args.components,
        seg_len=args.segment,
        em_iters=args.em_iters,
        cvtype=args.cvtype,
        seg_loops_init=args.seg_loops_init,
        seg_loops=args.seg_loops,
        reg_covar=args.reg_covar,
        vote=args.vote,
        frames_per_component=args.frames_per_component,
        max_model_components=args.max_model_components,
        merge_rule=args.merge_rule,
        relative_threshold=args.relative_threshold,
        merge_threshold=args.merge_threshold,
        min_gain_per_frame=args.min_gain_per_frame,
        pre_iters=args.pre_iters,
        bic_iters=args.bic_iters,
        n_speakers=max(0, args.speakers),
        cosine_threshold=args.cosine_threshold,
        ubm_components=args.ubm_components,
        relevance=args.relevance,
        cosine_min_frames=int(round(args.cosine_min_speech * FRAME_RATE)),
        stop_rule=args.stop_rule,
        clr_threshold=args.clr_threshold,
        n_jobs=max(1, args.jobs),
    )


def detect_speech(feats, be, args):
    """The (n_frames,) boolean speech mask of the recording's features ``feats``: the energy
    detector, or the GMM detector trained with the backend ``be``."""
    import sad

    if args.sad == "energy":
        return sad.energy_speech(sad.speech_level(feats, args.sad_level), args.vad_threshold)
    speech, _ = sad.gmm_speech(
        feats,
        lambda M, D: be.GMM(M, D, cvtype="diag", reg_covar=1e-3, seed=0),
        bias=args.sad_bias,
        level=args.sad_level,
    )
    return speech


def diarize(audio_path, args, log=print, on_round=None):
    """Returns a dict with segments, timings and counts. Raises DiarizationError on bad input.
    ``on_round(clusterer)`` is called after every merge round's scores (before its merge)."""
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
    # The one-time loading/compilation of the GMM code runs on a thread while the audio is read,
    # its features computed (those release the GIL) and its speech detected, and is not part of
    # the processing time: only a wait for it to finish would be, and that wait is subtracted.
    # The speech detector needs only the backend object (published as soon as it is made), not
    # the clustering's code: on a machine where nothing is compiled yet, both compile at once.
    from concurrent.futures import Future, ThreadPoolExecutor

    made = Future()

    def warm_up():
        t0 = time.perf_counter()
        try:
            be = warm_up_gmm(backend_name, params, N_FEATURES - args.first_cep, made=made)
        except BaseException as e:
            if not made.done():
                made.set_exception(e)
            raise
        return be, time.perf_counter() - t0

    pool = ThreadPoolExecutor(1)
    try:
        warming = pool.submit(warm_up)
        t_start = time.perf_counter()
        x, sr = load_audio(audio_path)
        duration = len(x) / sr
        t_load = time.perf_counter()
        feats = compute_features(x, sr)
        t_wait = time.perf_counter()
        be = made.result()
        t_feat = time.perf_counter()
        speech = detect_speech(feats, be, args)
        t_sad = time.perf_counter()
        be, t_warm = warming.result()
        t_ready = time.perf_counter()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    waited = (t_feat - t_wait) + (t_ready - t_sad)  # for the warm-up: not processing
    feats.speech = speech
    n_speech = int(speech.sum())
    if n_speech == 0:
        raise DiarizationError(f"{audio_path}: no speech found (silence or stationary noise only)")
    if n_speech < params.seg_len:
        raise DiarizationError(
            f"{audio_path}: only {n_speech / FRAME_RATE:.2f} s of speech, less "
            f"than one voting segment ({params.seg_len / FRAME_RATE:.2f} s)"
        )
    Xs = feats.cepstra(args.first_cep)[speech]
    clus = Clusterer(Xs, be, params, log=log if args.verbose else None, seed=args.seed, on_round=on_round)
    clus.run()
    lab = clus.final_labels(args.final, penalty=args.penalty, min_run=max(1, int(round(args.min_run * FRAME_RATE))))
    t_clus = time.perf_counter()
    # Name speakers by order of first appearance.
    uniq, first_idx = np.unique(lab, return_index=True)
    rank = np.empty(len(uniq), int)
    rank[np.argsort(first_idx)] = np.arange(len(uniq))
    full = np.full(len(speech), -1)
    full[speech] = rank[np.searchsorted(uniq, lab)]
    segments = labels_to_segments(full, FRAME_RATE, merge_gap=args.merge_gap, min_duration=args.min_segment)
    if args.overlap_margin > 0 and clus.final_ll is not None:
        from overlap import second_speaker

        second = second_speaker(clus.final_ll, lab, args.overlap_margin)
        known = np.isin(second, uniq)  # only speakers that the output already has
        full2 = np.full(len(speech), -1)
        full2[np.flatnonzero(speech)[known]] = rank[np.searchsorted(uniq, second[known])]
        segments = sorted(segments + labels_to_segments(full2, FRAME_RATE, min_duration=args.min_segment))
    t_end = time.perf_counter()
    return {
        "segments": segments,
        "n_speakers": len({s[2] for s in segments}),
        "duration": duration,
        "speech_seconds": n_speech / FRAME_RATE,
        "speech_mask": speech,
        "backend": be.name,
        "clusterer": clus,
        "times": {
            "warmup": t_warm,
            "load": t_load - t_start,
            "features": t_wait - t_load,
            "sad": t_sad - t_feat,
            "clustering": t_clus - t_ready,
            "output": t_end - t_clus,
            "total": t_end - t_start - waited,
        },
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
        print(
            f"diarize.py: internal error: {type(e).__name__}: {e} (run with --debug for the traceback)", file=sys.stderr
        )
        return 1


def _main(args) -> int:
    from rttm import read_rttm, write_rttm

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
    e2e = process_age()
    t = r["times"]
    c = r["clusterer"].prof
    print(
        f"{audio.name}: {r['duration']:.1f} s of audio, {r['speech_seconds']:.1f} s of speech, "
        f"backend {r['backend']}, {r['clusterer'].p.n_jobs} thread(s)"
    )
    print(f"speakers found: {r['n_speakers']}")
    print(
        f"processing time: {t['total']:.3f} s (read {t['load']:.3f}, features {t['features']:.3f}, "
        f"speech detection {t['sad']:.3f}, clustering {t['clustering']:.3f} [train "
        f"{c.seconds['train']:.3f}, score {c.seconds['score']:.3f}, BIC pairs {c.seconds['bic']:.3f}"
        f" x{c.calls['bic']}, python {c.other:.3f}], segments {t['output']:.3f})"
    )
    print(
        f"x-realtime: {r['duration'] / t['total']:.1f} (processing); "
        f"{r['duration'] / e2e:.1f} end to end ({e2e:.2f} s from process start to the RTTM "
        f"written, of which GMM warm-up {t['warmup']:.2f} s)"
    )
    if ref is not None:
        from rttm import der

        d = der(ref, r["segments"], uri, duration=r["duration"])
        tot = d["total"] or 1.0
        print(
            f"DER: {100 * d['der']:.2f} % (missed {100 * d['missed detection'] / tot:.2f} %, "
            f"false alarm {100 * d['false alarm'] / tot:.2f} %, confusion "
            f"{100 * d['confusion'] / tot:.2f} %; collar +-0.25 s, {len({s[2] for s in ref})} "
            "reference speakers)"
        )
    if args.plot:
        from rttm import plot_timeline

        plot_timeline(
            args.plot,
            ref,
            r["segments"],
            title=f"{audio.name}: reference (top) and hypothesis ({r['n_speakers']} speakers, backend {r['backend']})",
        )
        print(f"timeline written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
