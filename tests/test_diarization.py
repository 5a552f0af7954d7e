"""Tests of the speaker-diarization example (examples/diarization).

They need no speech synthesiser: they use the bundled meeting and synthetic signals (the real
recordings are tested in test_diarization_real.py). The clustering is checked with the
scikit-learn adapter and, when asp_gmm is importable, with its "c" and "numpy" backends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "diarization"
MEETING = EX / "data" / "meeting.flac"
MEETING_RTTM = EX / "data" / "meeting.rttm"
sys.path.insert(0, str(EX))

sf = pytest.importorskip("soundfile")

import cluster  # noqa: E402
import features  # noqa: E402
import reseg  # noqa: E402
import rttm  # noqa: E402
import sad  # noqa: E402
import sklearn_gmm  # noqa: E402


def _has_asp_gmm():
    try:
        import asp_gmm  # noqa: F401

        return True
    except ImportError:
        return False


# ---------------------------------------------------------------------------- RTTM and segments
def test_rttm_round_trip(tmp_path):
    segs = [(0.5, 1.25, "alice"), (2.0, 3.5, "bob"), (6.0, 0.75, "alice")]
    p = tmp_path / "x.rttm"
    rttm.write_rttm(p, "meet", segs)
    line = p.read_text().splitlines()[0].split()
    assert line == ["SPEAKER", "meet", "1", "0.500", "1.250", "<NA>", "<NA>", "alice", "<NA>", "<NA>"]
    back = rttm.read_rttm(p)
    assert list(back) == ["meet"]
    assert back["meet"] == segs
    d = rttm.der(segs, back["meet"], "meet", duration=7.0)
    assert d["der"] == 0.0


def test_read_rttm_errors(tmp_path):
    with pytest.raises(features.DiarizationError, match="not found"):
        rttm.read_rttm(tmp_path / "missing.rttm")
    bad = tmp_path / "bad.rttm"
    bad.write_text("SPEAKER meet 1 zero 1.0 <NA> <NA> a <NA> <NA>\n")
    with pytest.raises(features.DiarizationError, match="malformed"):
        rttm.read_rttm(bad)
    empty = tmp_path / "empty.rttm"
    empty.write_text(";; nothing\n")
    with pytest.raises(features.DiarizationError, match="no SPEAKER"):
        rttm.read_rttm(empty)


def test_labels_to_segments_merge_gap_and_times():
    lab = np.array([-1] * 10 + [0] * 100 + [-1] * 30 + [0] * 50 + [-1] * 80 + [1] * 60)
    segs = rttm.labels_to_segments(lab, 100, merge_gap=0.5, names=["a", "b"])
    # the 0.3 s pause of speaker a is bridged, the 0.8 s one before b is not
    assert [s[2] for s in segs] == ["a", "b"]
    assert segs[0][0] == pytest.approx(0.095)
    assert segs[0][0] + segs[0][1] == pytest.approx(1.895)
    assert segs[1][0] == pytest.approx(2.695)
    no_merge = rttm.labels_to_segments(lab, 100, merge_gap=0.0)
    assert len(no_merge) == 3


def test_labels_to_segments_min_duration():
    # a 30 ms run inside another speaker's turn joins that turn; a lone 50 ms burst is dropped
    lab = np.array([0] * 100 + [1] * 3 + [0] * 100 + [-1] * 100 + [1] * 5 + [-1] * 100 + [1] * 50)
    segs = rttm.labels_to_segments(lab, 100, merge_gap=0.5, min_duration=0.2)
    assert [s[2] for s in segs] == ["spk00", "spk01"]
    assert segs[0][1] == pytest.approx(2.025)
    assert all(d >= 0.2 for _, d, _ in segs)
    # without the minimum every run is written
    assert len(rttm.labels_to_segments(lab, 100, merge_gap=0.5)) == 5


def test_speaker_mapping_is_the_optimal_one():
    ref = [(0, 10, "alice"), (10, 10, "bob"), (20, 5, "carol")]
    # h1 overlaps bob most, h2 alice; h3 overlaps alice a little but alice is taken
    hyp = [(0, 9, "h2"), (9, 11, "h1"), (20, 5, "h3"), (25, 1, "h4")]
    assert rttm.speaker_mapping(ref, hyp) == {"h1": "bob", "h2": "alice", "h3": "carol"}


def test_der_agrees_with_pyannote_metrics(rng):
    """rttm.der (NumPy) against pyannote.metrics' DiarizationErrorRate on random diarizations with
    overlapping speakers, missed and extra speakers, gaps and boundaries near one another."""
    pytest.importorskip("pyannote.metrics")

    def segs(n, spk):
        out = []
        for k in range(spk):
            t = rng.uniform(0, 3)
            for _ in range(n):
                d = rng.uniform(0.05, 4)
                out.append((round(t, 2), round(d, 2), f"s{k}"))
                t += d + rng.uniform(0.01, 5)
        return out

    for _ in range(60):
        ref = segs(rng.integers(1, 8), rng.integers(1, 5))
        hyp = segs(rng.integers(0, 8), rng.integers(1, 6))
        dur = max(s + d for s, d, _ in ref + hyp) + rng.uniform(0, 3)
        ours, theirs = rttm.der(ref, hyp, "u", duration=dur), rttm.der_pyannote(ref, hyp, "u", duration=dur)
        for k in ("der", "missed detection", "false alarm", "confusion", "total", "correct"):
            assert ours[k] == pytest.approx(theirs[k], abs=1e-9), (k, ref, hyp, dur)
    assert rttm.der([], [], "u", duration=5.0)["der"] == 0.0


def test_max_weight_matching_equals_scipy(rng):
    from scipy.optimize import linear_sum_assignment

    for t in range(300):
        n, m = rng.integers(1, 9), rng.integers(1, 9)
        w = rng.random((n, m)) * (rng.random((n, m)) < 0.6)
        if t % 3 == 0:
            w = np.round(w * 3)  # ties
        ours = rttm.max_weight_matching(w)
        r, c = linear_sum_assignment(-w)
        assert sum(w[i, j] for i, j in ours) == pytest.approx(w[r, c].sum(), abs=1e-12)
        assert len(ours) == min(n, m) == len({i for i, _ in ours}) == len({j for _, j in ours})


def test_der_collar_is_nist_quarter_second():
    ref = [(0.0, 10.0, "a"), (10.0, 10.0, "b")]
    # boundary 0.2 s late: inside the +-0.25 s collar, no error
    assert rttm.der(ref, [(0.0, 10.2, "x"), (10.2, 9.8, "y")], "u", duration=20)["der"] == 0
    # the scored region is the whole file: speech claimed after the reference's end is an error
    d = rttm.der(ref, ref + [(21.0, 1.0, "z")], "u", duration=22.0)
    assert d["false alarm"] == pytest.approx(1.0)
    # boundary 0.5 s late: 0.25 s of confusion outside the collar, over 19 scored seconds
    d = rttm.der(ref, [(0.0, 10.5, "x"), (10.5, 9.5, "y")], "u", duration=20)
    assert d["der"] == pytest.approx(0.25 / 19.0, rel=1e-3)


# ---------------------------------------------------------------------------- votes
def test_block_majority_vote():
    best = np.array([0, 0, 1, 0, 1, 1, 1, 0, 2, 2, 0, 2, 2])  # blocks of 4; the last takes 5
    out = cluster.majority_vote(best, 3, 4)
    assert out.tolist() == [0] * 4 + [1] * 4 + [2] * 5
    # ties go to the lowest index, like scipy.stats.mode
    assert cluster.majority_vote(np.array([1, 0, 0, 1]), 2, 4).tolist() == [0, 0, 0, 0]


def test_sliding_majority_places_change_where_majority_flips():
    rng = np.random.default_rng(0)
    truth = np.r_[np.zeros(330, int), np.ones(470, int)]
    noisy = truth.copy()
    flip = rng.random(len(truth)) < 0.25  # a quarter of the frame decisions wrong
    noisy[flip] = 1 - noisy[flip]
    out = cluster.sliding_majority(noisy, 2, 100)
    change = np.flatnonzero(np.diff(out))
    assert len(change) == 1 and abs(change[0] + 1 - 330) <= 20
    blocks = cluster.majority_vote(noisy, 2, 100)
    assert np.flatnonzero(np.diff(blocks))[0] + 1 in (300, 400)  # the block vote snaps to an edge


@pytest.mark.parametrize("width", [1, 2, 7, 255, 256, 300])
@pytest.mark.parametrize("k", [1, 3, 8, 9, 17])
def test_sliding_majority_equals_counting_every_window(width, k):
    """The packed-counter window counts (8 or 16 bits a cluster, prefix sums that wrap) give the
    vote of counting each window's frames directly, ties to the lowest cluster, windows shifted
    inside at the ends, fewer frames than one window included."""
    rng = np.random.default_rng(width * 100 + k)
    for n in (1, 5, 400, 1200):
        best = np.repeat(rng.integers(0, k, n), rng.integers(1, 5, n))[:n]  # runs, as frame winners have
        best[rng.random(n) < 0.3] = rng.integers(0, k)  # and many ties among a few clusters
        w = min(width, n)
        want = np.empty(n, int)
        for i in range(n):
            j = min(max(i - width // 2, 0), n - w)
            want[i] = np.bincount(best[j : j + w], minlength=k).argmax()
        assert cluster.sliding_majority(best, k, width).tolist() == want.tolist(), (n, width, k)


# ---------------------------------------------------------------------------- features
def _tone_bursts(sr=16000):
    t = np.arange(int(0.8 * sr)) / sr
    burst = (0.3 * np.sin(2 * np.pi * 220 * t) * np.hanning(len(t))).astype(np.float32)
    gap = np.zeros(int(0.7 * sr), np.float32)
    x = np.concatenate([gap, burst, gap, burst, gap])
    return x + 1e-4 * np.random.default_rng(1).standard_normal(len(x)).astype(np.float32)


def test_features_shape_rate_and_speech_detection():
    x = _tone_bursts()
    f = features.compute_features(x, 16000)
    assert f.cep.shape[1] == 20 and f.cep.dtype == np.float32
    assert abs(len(f.log_energy) - len(x) / 160) <= 2  # 100 frames per second
    f.speech = sad.energy_speech(f.log_energy)
    on = f.speech.astype(int)
    assert on[:60].sum() == 0 and on[-60:].sum() == 0
    assert on[80:140].all()  # inside the first burst (0.7 s to 1.5 s)
    assert f.mfcc.shape[1] == features.N_FEATURES == 20  # c0..c19
    assert np.allclose(f.mfcc[f.speech].mean(0), 0, atol=1e-4)
    # another sample rate gives the same frame rate; stationary noise alone is no speech
    f8 = features.compute_features(x[::2].copy(), 8000)
    assert abs(len(f8.log_energy) - len(f.log_energy)) <= 2
    noise = 0.01 * np.random.default_rng(2).standard_normal(32000).astype(np.float32)
    fn = features.compute_features(noise, 16000)
    assert not sad.energy_speech(fn.log_energy).any()
    assert not sad.gmm_speech(fn, lambda M, D: sklearn_gmm.GMM(M, D, cvtype="diag"))[0].any()


def test_cepstra_match_a_direct_computation():
    """The chunked, strided front end gives the textbook MFCC of a frame."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal(16000).astype(np.float32)
    f = features.compute_features(x, 16000, chunk=7)  # chunks that do not divide the frames
    i = 40
    frame = np.pad(x, 256)[i * 160 : i * 160 + 512].astype(np.float64)
    w = np.zeros(512)
    w[56:456] = np.hamming(401)[:-1]
    power = np.abs(np.fft.rfft(frame * w)) ** 2
    log_mel = np.log(power @ features.mel_filterbank(16000, 512, 40).astype(np.float64) + 1e-8)
    assert np.allclose(f.cep[i], log_mel @ features.dct_matrix(40, 20), rtol=1e-3, atol=1e-3)
    assert f.log_energy[i] == pytest.approx(10 * np.log10(power.sum() + 1e-10), abs=1e-3)


def test_close_gaps_fills_pauses_inside_speech_only():
    m = np.array([0, 1, 1, 0, 1, 1, 0, 0, 1, 0], bool)
    # the gap of one frame is closed, the edges are left alone (the old detector never closed one)
    assert sad.close_gaps(m, 2, 0).astype(int).tolist() == [0, 1, 1, 1, 1, 1, 0, 0, 1, 0]
    assert sad.close_gaps(m, 3, 0).astype(int).tolist() == [0, 1, 1, 1, 1, 1, 1, 1, 1, 0]
    assert sad.close_gaps(m, 0, 2).astype(int).tolist() == [0, 1, 1, 0, 1, 1, 0, 0, 0, 0]


def test_gmm_speech_finds_the_bursts():
    f = features.compute_features(_tone_bursts(), 16000)
    m, info = sad.gmm_speech(f, lambda M, D: sklearn_gmm.GMM(M, D, cvtype="diag", reg_covar=1e-3, seed=0))
    assert info["boot_speech"] > 0 and info["boot_nonspeech"] > 0
    on = m.astype(int)
    # both bursts (0.7-1.5 s, 2.2-3.0 s) are found around their peaks, no silence is speech
    assert on[95:125].all() and on[245:275].all()
    assert on[:60].sum() == 0 and on[160:215].sum() == 0 and on[-60:].sum() == 0


# ----------------------------------------------------------------- speech detector (sad.py)
SR = 16000


def _voiced(duration, f0, rng, sr=SR):
    """A speech-like burst: a harmonic complex (f0 gliding by 25 %, harmonics up to 4 kHz with a
    falling spectrum and two formant-like peaks) under a syllable-rate (4 Hz) envelope."""
    t = np.arange(int(duration * sr)) / sr
    phase = 2 * np.pi * np.cumsum(f0 * (1 + 0.25 * t / duration)) / sr
    x = np.zeros_like(t)
    for k in range(1, int(4000 / f0)):
        formants = 1 + 2 * np.exp(-(((k * f0 - 600) / 200) ** 2)) + np.exp(-(((k * f0 - 1700) / 300) ** 2))
        x += formants / k * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    edge = np.minimum(1.0, np.minimum(t, duration - t) / 0.05)  # 50 ms ramps
    env = edge * (0.75 + 0.25 * np.sin(2 * np.pi * 4 * t))
    return env * x / np.abs(x).max()


def _thump(duration, rng, sr=SR):
    """A headset breath pop or bump: loud, and below 200 Hz (an 80 Hz tone and low-passed noise)."""
    n = int(duration * sr)
    t = np.arange(n) / sr
    low = np.convolve(rng.standard_normal(n), np.hanning(161) / 80.0, mode="same")  # ~100 Hz low-pass
    return np.hanning(n) * (np.sin(2 * np.pi * 80 * t) + low)


def _scene(rng, speech=True, thumps=True, snr_db=15.0):
    """8 s of white noise with speech-like bursts at 0.5, 2.5, 4.5 and 6.5 s (1.2 s each) and
    low-frequency thumps at 1.9, 3.9 and 5.9 s (0.3 s, as loud as the bursts' peaks). Returns the
    features and the frame masks (100 frames/s) of the bursts' and the thumps' central parts."""
    x = np.zeros(8 * SR)
    T = 1 + len(x) // 160  # frames of features.compute_features (centred, 10 ms)
    burst, thump = np.zeros(T, bool), np.zeros(T, bool)
    if speech:
        for start, f0 in ((0.5, 120.0), (2.5, 200.0), (4.5, 150.0), (6.5, 240.0)):
            i = int(start * SR)
            x[i : i + int(1.2 * SR)] += _voiced(1.2, f0, rng)
            burst[int(start * 100) + 15 : int(start * 100) + 105] = True
    if thumps:
        for start in (1.9, 3.9, 5.9):
            i = int(start * SR)
            x[i : i + int(0.3 * SR)] += _thump(0.3, rng)
            thump[int(start * 100) + 8 : int(start * 100) + 22] = True
    noise_rms = 0.3 * 10 ** (-snr_db / 20)  # the bursts' RMS is about 0.3
    x = 0.1 * (x + noise_rms * rng.standard_normal(len(x)))
    f = features.compute_features(x.astype(np.float32), SR)
    assert len(f.log_energy) == T
    return f, burst, thump


def _sad_factory(M, D):
    return sklearn_gmm.GMM(M, D, cvtype="diag", reg_covar=1e-3, seed=0)


def test_band_energy_is_deaf_below_200_hz():
    """Features.band_energy holds the level of features.SPEECH_BAND only: an 80 Hz tone raises the
    whole spectrum's level by tens of dB and the band's by little; a 1 kHz tone raises both."""
    t = np.arange(SR) / SR
    rng = np.random.default_rng(0)
    floor = 1e-3 * rng.standard_normal(SR)
    quiet = features.compute_features(floor.astype(np.float32), SR)
    low = features.compute_features((floor + 0.3 * np.sin(2 * np.pi * 80 * t)).astype(np.float32), SR)
    mid = features.compute_features((floor + 0.3 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32), SR)
    mid_, low_, quiet_ = (np.median(f.band_energy[10:-10]) for f in (mid, low, quiet))
    assert np.median(low.log_energy[10:-10]) - np.median(quiet.log_energy[10:-10]) > 40
    assert low_ - quiet_ < 20  # the window's leakage only
    assert mid_ - quiet_ > 40
    assert mid.band_energy.dtype == np.float32 and len(mid.band_energy) == len(mid.log_energy)


def test_speech_detector_finds_voiced_bursts_in_noise_and_not_the_thumps():
    """Speech-like bursts in white noise (15 dB SNR) are speech, the noise between them and the
    low-frequency thumps are not; the whole spectrum's level (the former detector) takes the
    thumps for speech, so the test can fail."""
    f, burst, thump = _scene(np.random.default_rng(3))
    mask, info = sad.gmm_speech(f, _sad_factory)
    assert info["boot_speech"] > 0
    assert mask[burst].mean() > 0.95, mask[burst].mean()
    assert mask[thump].mean() < 0.05, mask[thump].mean()
    assert mask[~(burst | thump)].mean() < 0.2
    full, _ = sad.gmm_speech(f, _sad_factory, level="full")
    assert full[thump].mean() > 0.5, full[thump].mean()  # the bias the band level removes


@pytest.mark.parametrize("thumps", [False, True])
def test_speech_detector_marks_no_noise_as_speech(thumps):
    """White noise alone, with or without low-frequency thumps 30 dB above it, holds no speech:
    the band's level is flat (under min_range_db) and the detector returns no frame."""
    for seed in range(3):
        f, _, _ = _scene(np.random.default_rng(seed), speech=False, thumps=thumps)
        mask, info = sad.gmm_speech(f, _sad_factory)
        assert not mask.any(), (seed, mask.mean(), info)
        assert not sad.energy_speech(sad.speech_level(f, "band")).any()
    if thumps:  # the whole spectrum's level sees the thumps
        assert sad.energy_speech(sad.speech_level(f, "full")).any()


def test_speech_level_rejects_unknown_levels():
    f, _, _ = _scene(np.random.default_rng(0))
    with pytest.raises(ValueError, match="'band' or 'full'"):
        sad.speech_level(f, "loud")
    f.band_energy = None
    with pytest.raises(ValueError, match="band_energy"):
        sad.gmm_speech(f, _sad_factory)


def test_viterbi_resegmentation():
    rng = np.random.default_rng(0)
    truth = np.r_[np.zeros(300, int), np.ones(400, int), np.zeros(300, int)]
    ll = rng.normal(0, 3, (2, len(truth)))
    ll[truth, np.arange(len(truth))] += 2.0  # noisy frame scores favouring the truth
    lab = reseg.resegment(ll, block=5, penalty=40, min_run=30)
    st, en, val = reseg.runs(lab)
    assert val.tolist() == [0, 1, 0]
    assert abs(st[1] - 300) <= 10 and abs(st[2] - 700) <= 10
    # a run shorter than min_run goes to a neighbour
    lab = np.r_[np.zeros(50, int), np.ones(10, int), np.zeros(50, int)]
    assert (reseg.enforce_min_run(lab, np.zeros((2, 110)), 20) == 0).all()


def test_load_audio_mixes_stereo_down(tmp_path):
    left = np.linspace(-0.5, 0.5, 22050, dtype=np.float32)
    p = tmp_path / "st.flac"
    sf.write(str(p), np.stack([left, np.zeros_like(left)], axis=1), 22050)
    x, sr = features.load_audio(p)
    assert sr == 22050 and x.ndim == 1 and np.allclose(x, left / 2, atol=1e-4)
    # threaded decoding of a long file gives the same samples as one read
    long = np.tile(left, 70)
    sf.write(str(p), long, 22050, subtype="PCM_16")
    a, _ = features.load_audio(p, n_jobs=1)
    b, _ = features.load_audio(p, n_jobs=3)
    assert np.array_equal(a, b)


# ---------------------------------------------------------------------------- the adapter
def test_sklearn_adapter_api_and_bic_sign():
    rng = np.random.default_rng(0)
    a = rng.normal(0, 1, (600, 3)).astype(np.float32)
    b = rng.normal(6, 1, (600, 3)).astype(np.float32)
    for cv in ("diag", "full"):
        g = sklearn_gmm.GMM(2, 3, cvtype=cv)
        ll = g.train(a, min_em_iters=3, max_em_iters=3)
        assert ll == pytest.approx(g.score(a).sum()) and g.loglik == ll and g.n_events == 600
        lp, post = g.eval(a)
        assert post.shape == (600, 2) and np.allclose(post.sum(1), 1)
        assert g.covars.shape == ((2, 3, 3) if cv == "full" else (2, 3))
        h = sklearn_gmm.GMM(2, 3, cvtype=cv)
        h.train(b, 3, 3)
        g2 = sklearn_gmm.GMM(2, 3, cvtype=cv)
        g2.train(a[:300], 3, 3)
        g3 = sklearn_gmm.GMM(2, 3, cvtype=cv)
        g3.train(a[300:], 3, 3)
        merged, diff_score = sklearn_gmm.compute_distance_BIC(
            g, h, np.concatenate([a, b]), min_em_iters=3, max_em_iters=3
        )
        assert merged.M == 4 and diff_score < 0
        _, same_score = sklearn_gmm.compute_distance_BIC(g2, g3, a, min_em_iters=3, max_em_iters=3)
        assert same_score > diff_score


@pytest.mark.skipif(not _has_asp_gmm(), reason="asp_gmm not importable")
def test_sklearn_adapter_matches_asp_gmm_numpy():
    """The adapter and asp_gmm run the same EM: from the same parameters, same results."""
    from asp_gmm import GMM

    rng = np.random.default_rng(3)
    X = np.concatenate([rng.normal(0, 1, (400, 4)), rng.normal(3, 0.5, (400, 4))]).astype(np.float64)
    for cv in ("diag", "full"):
        a = sklearn_gmm.GMM(3, 4, cvtype=cv, dtype=np.float64, reg_covar=1e-3)
        b = GMM(3, 4, cvtype=cv, dtype=np.float64, reg_covar=1e-3, backend="numpy")
        la = a.train(X, 4, 4)
        lb = b.train(X, 4, 4)
        assert la == pytest.approx(lb, rel=1e-6)
        assert np.allclose(a.means, b.means, atol=1e-6)
        la, lb = a.train(X[:500], 2, 2), b.train(X[:500], 2, 2)  # warm start
        assert la == pytest.approx(lb, rel=1e-6)


# ---------------------------------------------------------------------------- clustering
def test_supervector_cosine_separates_sources():
    """Two clusters of one source point the same way from the recording's background model,
    clusters of different sources do not; the supervectors have unit length."""
    rng = np.random.default_rng(3)
    D = 6
    centres = 1.5 * rng.standard_normal((3, D))
    X = np.concatenate([c + rng.standard_normal((600, D)) for c in centres]).astype(np.float32)
    labels = np.repeat([0, 1, 2, 3], [300, 300, 600, 600])  # 0 and 1: halves of source 0
    be = cluster.Backend("c" if _has_asp_gmm() else "sklearn")
    c = cluster.Clusterer(X, be, cluster.ClusterParams(ubm_components=8, seg_len=100))
    S = c.supervectors(labels, [0, 1, 2, 3])
    assert S.shape == (4, 8 * D)
    assert np.allclose(np.linalg.norm(S, axis=1), 1.0)
    same = S[0] @ S[1]
    others = [S[i] @ S[j] for i, j in ((0, 2), (0, 3), (1, 2), (1, 3), (2, 3))]
    assert same > 0.5 and max(others) < 0.0, (same, others)


def _two_sources(rng, n, D=6):
    centres = 1.5 * rng.standard_normal((2, D))
    X = np.concatenate([c + rng.standard_normal((2 * n, D)) for c in centres]).astype(np.float32)
    return X, np.repeat([0, 1, 2, 3], n)  # clusters 0, 1: halves of source 0; 2, 3: of source 1


def test_clr_separates_sources():
    """The cross-likelihood ratio per frame of two halves of one source is above 0, of two
    sources below, with clusters of 4 s and of 16 s. (It grows with the clusters' sizes: the MAP
    adaptation moves further from the background with more frames.)"""
    rng = np.random.default_rng(5)
    be = cluster.Backend("c" if _has_asp_gmm() else "sklearn")
    for n in (400, 1600):
        X, labels = _two_sources(rng, n)
        c = cluster.Clusterer(X, be, cluster.ClusterParams(ubm_components=8, seg_len=100))
        same_a, diff, same_b = c.clr(labels, (0, 1)), c.clr(labels, (1, 2)), c.clr(labels, (2, 3))
        assert same_a > 0 > diff and same_b > 0, (n, same_a, diff, same_b)


def test_merge_gain_per_frame_does_not_grow_with_length():
    """The per-frame rule's score (the merge's log-likelihood gain per frame of the pair, 8 + 8
    Gaussians merged into 16) stays on the same side of the default threshold for clusters of 4 s
    and of 16 s: above it for one source's two halves, below for two sources."""
    rng = np.random.default_rng(6)
    be = cluster.Backend("c" if _has_asp_gmm() else "sklearn")
    p = cluster.ClusterParams()
    out = {}
    for n in (400, 1600):
        X, labels = _two_sources(rng, n)
        gs = []
        for k in range(4):
            g = be.GMM(8, X.shape[1], cvtype="diag", reg_covar=1e-3, seed=k)
            g.train(X[labels == k], min_em_iters=8, max_em_iters=8)
            gs.append(g)
        for i, j in ((0, 1), (1, 2), (2, 3)):
            Xij = X[(labels == i) | (labels == j)]
            out[n, i, j] = be.bic(gs[i], gs[j], Xij, 3)[1] / len(Xij)
    for n in (400, 1600):
        assert min(out[n, 0, 1], out[n, 2, 3]) > p.merge_threshold > out[n, 1, 2], out
    assert abs(out[1600, 1, 2] - out[400, 1, 2]) < 0.5 * abs(out[400, 1, 2]), out


def test_overlap_second_speaker_where_the_lead_is_small():
    """A second speaker only where the chosen speaker's mean lead over the runner-up is under the
    margin for at least min_run frames; never the chosen speaker itself; margin 0 is off."""
    import overlap

    n = 400
    ll = np.zeros((3, n))
    ll[0] = 0.0
    ll[1] = -10.0
    ll[2] = -20.0
    ll[1, 200:300] = -0.2  # speaker 1 nearly as likely as 0 for 1 s
    ll[2, 50:60] = -0.1  # speaker 2 close for only 0.1 s: too short
    labels = np.zeros(n, int)
    sec = overlap.second_speaker(ll, labels, margin=1.0, width=20, min_run=30)
    assert set(np.unique(sec[200:300])) <= {1, -1} and (sec[210:290] == 1).all()
    assert (sec[:180] == -1).all() and (sec[320:] == -1).all()
    assert not (sec == labels).any()
    assert (overlap.second_speaker(ll, labels, margin=0.0) == -1).all()
    assert (overlap.second_speaker(ll[:1], labels, margin=1.0) == -1).all()


@pytest.fixture(scope="module")
def meeting():
    x, sr = features.load_audio(MEETING)
    f = features.compute_features(x, sr)
    f.speech = sad.energy_speech(f.log_energy)
    ref = rttm.read_rttm(MEETING_RTTM)["meeting"]
    return f, ref


def _diarize_frames(meeting, backend, **kw):
    f, ref = meeting
    kw.setdefault("n_jobs", 2)  # the threaded path must give the serial result (checked below)
    p = cluster.ClusterParams(**kw)
    c = cluster.Clusterer(f.mfcc[f.speech], cluster.Backend(backend), p)
    c.run()
    lab = c.final_labels()
    full = np.full(len(f.speech), -1)
    full[f.speech] = lab
    segs = rttm.labels_to_segments(full, features.FRAME_RATE, merge_gap=0.5, min_duration=0.2)
    return len(np.unique(lab)), rttm.der(ref, segs, "meeting", duration=len(f.speech) / 100)["der"], c


@pytest.mark.parametrize("backend", ["c"] if _has_asp_gmm() else ["sklearn"])
def test_clustering_finds_the_four_speakers(meeting, backend):
    n, d, c = _diarize_frames(meeting, backend)
    assert n == 4, f"{backend}: {n} speakers, history {c.history}"
    assert d < 0.10, f"{backend}: DER {d:.3f}"
    # stopped by the merge rule, not by a lack of clusters: the last round's best pair was under
    # the threshold on the recording's scale or its supervectors' cosine under the cosine
    # threshold; every merge before it passed both
    assert c.prof.rounds >= 1 and c.prof.calls["bic"] > 0
    assert c.history[-1][2] is None
    assert c.history[-1][1] < c.p.relative_threshold or c.pair_cosines[-1] < c.p.cosine_threshold
    assert all(h[1] >= c.p.relative_threshold for h in c.history[:-1])
    # (a cosine is NaN where a cluster was too small to be checked)
    assert not any(x < c.p.cosine_threshold for x in c.pair_cosines[:-1])


def test_seed_rule_is_still_reachable(meeting):
    """The former algorithm (growing models, BIC score > 0, sliding vote) runs from flags."""
    n, d, c = _diarize_frames(
        meeting,
        "c" if _has_asp_gmm() else "sklearn",
        merge_rule="bic",
        n_components=5,
        max_model_components=32,
        pre_iters=0,
        bic_iters=0,
    )
    assert n == 4 and d < 0.10
    assert all(h[1] > 0 for h in c.history[:-1]) and c.history[-1][1] <= 0


BACKENDS = ["sklearn"] + (["c", "numpy"] if _has_asp_gmm() else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_agree_on_the_first_half(meeting, backend):
    """The same clustering code on every implementation (the first minute: the full meeting takes
    about a minute on the scikit-learn and NumPy reference backends)."""
    f, ref = meeting
    half = np.zeros_like(f.speech)
    half[:6000] = f.speech[:6000]
    sub = features.Features(f.cep, f.log_energy, f.duration, speech=half)
    ref60 = [(s, min(d, 60.0 - s), lab) for s, d, lab in ref if s < 60.0]
    n, d, c = _diarize_frames((sub, ref60), backend, n_init=8)
    n_ref = len({s[2] for s in ref60})
    assert n == n_ref, f"{backend}: {n} speakers of {n_ref}, history {c.history}"
    assert d < 0.10, f"{backend}: DER {d:.3f}"


def test_threads_do_not_change_the_result(meeting):
    f, _ = meeting
    X = f.mfcc[f.speech][:4000]
    out = []
    for jobs in (1, 3):
        c = cluster.Clusterer(X, cluster.Backend("sklearn"), cluster.ClusterParams(n_init=6, n_jobs=jobs))
        out.append((c.run().tolist(), c.history))
    assert out[0] == out[1]


@pytest.mark.skipif(
    not _has_asp_gmm(), reason="asp_gmm not importable (full covariance on scikit-learn is too slow for the test suite)"
)
def test_clustering_full_covariance(meeting):
    n, d, c = _diarize_frames(meeting, "c", cvtype="full")
    # Full covariances on 2 minutes leave one small extra cluster (251 frames); the DER stays low.
    assert 4 <= n <= 5, f"{n} speakers, history {c.history}"
    assert d < 0.10, f"DER {d:.3f}"
    assert all(np.asarray(g.covars).ndim == 3 for g in c.gmms)


def test_bundled_meeting_is_small_and_matches_its_rttm():
    assert MEETING.stat().st_size <= 2 * 1024 * 1024
    info = sf.info(str(MEETING))
    ref = rttm.read_rttm(MEETING_RTTM)["meeting"]
    assert len({s[2] for s in ref}) == 4
    assert 100 <= info.duration <= 150
    assert max(s[0] + s[1] for s in ref) <= info.duration


# ---------------------------------------------------------------------------- the command
def _run(*args, timeout=120):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run(
        [sys.executable, str(EX / "diarize.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def _write(path, x, sr=16000):
    sf.write(str(path), np.asarray(x, np.float32), sr)
    return path


@pytest.mark.parametrize(
    "case,message",
    [
        ("missing", "no such file"),
        ("garbage", "cannot read audio"),
        ("empty", "no audio samples"),
        ("short", "shorter than one voting segment"),
    ],
)
def test_bad_audio_fails_cleanly(tmp_path, case, message):
    p = tmp_path / f"{case}.wav"
    if case == "garbage":
        p.write_bytes(b"this is not audio" * 50)
    elif case == "empty":
        _write(p, np.zeros(0))
    elif case == "short":
        _write(p, 0.1 * np.random.default_rng(0).standard_normal(16000))
    r = _run(p, "--rttm", tmp_path / "out.rttm", "--backend", "sklearn")
    assert r.returncode == 2, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out.rttm").exists()


def test_silence_and_missing_reference_fail_cleanly(tmp_path):
    p = _write(tmp_path / "silence.wav", np.zeros(16000 * 5))
    r = _run(p, "--rttm", tmp_path / "out.rttm", "--backend", "sklearn")
    assert r.returncode == 2 and "no speech" in r.stderr and "Traceback" not in r.stderr
    r = _run(MEETING, "--rttm", tmp_path / "out.rttm", "--ref", tmp_path / "nope.rttm")
    assert r.returncode == 2 and "reference RTTM not found" in r.stderr
    assert "Traceback" not in r.stderr


def test_command_on_bundled_meeting(tmp_path):
    out, png = tmp_path / "hyp.rttm", tmp_path / "t.png"
    # the README/Makefile command: the best backend present (scikit-learn without asp_gmm)
    r = _run(MEETING, "--rttm", out, "--ref", MEETING_RTTM, "--plot", png)
    assert r.returncode == 0, r.stderr
    # 4 speakers; the defaults chosen on real speech (benchmarks/diarization_cv.py) find a fifth
    # of 1 s there (3.7 % DER)
    assert "speakers found: 4" in r.stdout or "speakers found: 5" in r.stdout
    der = float(r.stdout.split("DER:")[1].split("%")[0])
    assert der < 5.0
    assert "x-realtime:" in r.stdout and "(processing)" in r.stdout and "end to end" in r.stdout
    proc = float(r.stdout.split("x-realtime: ")[1].split(" (processing)")[0])
    e2e = float(r.stdout.split("(processing); ")[1].split(" end to end")[0])
    assert 0 < e2e < proc  # end to end counts the imports and the warm-up as well
    hyp = rttm.read_rttm(out)["meeting"]
    assert len({s[2] for s in hyp}) in (4, 5)
    assert min(d for _, d, _ in hyp) >= 0.2 - 1e-9  # no absurdly short segment
    assert png.stat().st_size > 1000


def test_help_shows_no_default_for_required_rttm():
    r = _run("--help")
    assert r.returncode == 0
    rttm_help = r.stdout.split("--rttm RTTM", 2)[-1].split("--ref")[0]
    assert "required" in rttm_help and "default: None" not in rttm_help
    assert "default: None" not in r.stdout
    assert "(default: relative)" in r.stdout  # real defaults are still shown


@pytest.mark.parametrize("K", [2, 4, 8, 9])
def test_viterbi_on_lists_and_arrays_agree(K):
    """The recursion on Python floats (up to reseg.LIST_STATES states) and on arrays give the same
    path, ties included (scores on a coarse grid), and it is the best path."""
    rng = np.random.default_rng(K)
    for T in (1, 2, 7, 500):
        S = rng.integers(-3, 4, (T, K)).astype(np.float64) * 5.0  # many equal sums
        a, b = reseg._forward_lists(S, 10.0), reseg._forward_arrays(S, 10.0)
        assert np.array_equal(a, b), (K, T)
    score = rng.normal(0, 5, (K, 9))
    path = reseg.viterbi(score, 7.0)
    value = lambda p: score[p, np.arange(9)].sum() - 7.0 * np.count_nonzero(np.diff(p))  # noqa: E731
    best = max(value(np.array(p)) for p in np.ndindex(*([K] * 9))) if K <= 2 else None
    if best is not None:
        assert value(path) == pytest.approx(best)


def test_balanced_shares_cover_every_item_once_and_even_the_load():
    rng = np.random.default_rng(3)
    cost = list(rng.integers(1, 1000, 57).astype(float))
    shares = cluster._balanced_shares(cost, 2)
    assert sorted(i for s in shares for i in s) == list(range(57))
    loads = [sum(cost[i] for i in s) for s in shares]
    assert max(loads) - min(loads) <= max(cost)  # greedy largest-first: within one item
    interleaved = [sum(cost[i::2]) for i in range(2)]
    assert max(loads) <= max(interleaved)
    assert shares == cluster._balanced_shares(cost, 2)  # deterministic
    assert cluster._balanced_shares([5.0], 3) == [[0]]  # no empty shares
