"""Audio loading and acoustic features for the diarizer (NumPy only: no librosa, no numba warm-up).

Frames: 25 ms Hamming window, 10 ms hop (100 frames/s), frame ``i`` centred on ``i * 10 ms``.

* ``Features.cep``: cepstra c0..c19 of a 40-band log-mel spectrum (20 Hz - 8 kHz, HTK-style
  triangular filters on the mel scale, DCT-II), float32. c0 is the frame's log level.
* ``Features.log_energy``: frame log-energy in dB.
* ``Features.band_energy``: frame log-energy above 200 Hz (up to 8 kHz) in dB: the speech
  detector's level, deaf to the low-frequency breath pops and bumps of headset microphones.
* Helpers for what the stages build from them: ``deltas`` (regression over +-2 frames),
  ``cmvn`` (mean/variance normalisation over a mask), ``sliding_cmn`` (short-time mean removal).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

FRAME_RATE = 100  # frames per second (10 ms hop)
N_FEATURES = 20  # columns of Features.mfcc (c0..c19)
SPEECH_BAND = (200.0, 8000.0)  # Hz: Features.band_energy (chosen by benchmarks/diarization_sad_cv.py)


class DiarizationError(Exception):
    """A problem with the input that the user can fix: reported as one line, exit status 2."""


@dataclass
class Features:
    cep: np.ndarray  # (T, n_cep) float32: c0 (log level) .. c{n_cep-1}
    log_energy: np.ndarray  # (T,) float32, dB
    duration: float  # seconds of audio
    frame_rate: int = FRAME_RATE
    speech: np.ndarray | None = None  # (T,) bool, set by the speech detector
    band_energy: np.ndarray | None = None  # (T,) float32, dB in SPEECH_BAND

    @property
    def mfcc(self) -> np.ndarray:
        """(T, 20) float32: c0..c19 normalised over the speech frames (the clustering's features).

        The level c0 is kept: on a mixed-headset or far-field recording a speaker's level follows
        their distance to the microphones, and it separates voices that the spectral shape alone
        does not (AMI clips of the development set, with the right number of speakers given: DER
        15.0 instead of 18.7 % on one, 82.8 instead of 91.4 % on another)."""
        return self.cepstra(0)

    def cepstra(self, first: int = 0) -> np.ndarray:
        """(T, N_FEATURES - first) float32: c{first}..c19 normalised over the speech frames."""
        mask = self.speech if self.speech is not None and self.speech.sum() > 1 else None
        return cmvn(self.cep[:, first:N_FEATURES], mask)


def default_jobs() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(16, n))


def load_audio(path, n_jobs: int | None = None) -> tuple[np.ndarray, int]:
    """Read WAV/FLAC/OGG (anything libsndfile reads) at its own rate; stereo is mixed down.

    Long files are decoded in ``n_jobs`` pieces on threads (libsndfile runs without the GIL)."""
    import soundfile as sf

    try:
        info = sf.info(str(path))
        n, ch = info.frames, info.channels
        jobs = n_jobs or default_jobs()
        if n <= 0:
            raise DiarizationError(f"{path}: the file contains no audio samples")
        if jobs > 1 and n > 60 * info.samplerate:
            out = np.empty((n, ch), np.float32)
            bounds = np.linspace(0, n, jobs + 1).astype(int)

            def part(i):
                with sf.SoundFile(str(path)) as f:
                    f.seek(int(bounds[i]))
                    got = f.read(
                        int(bounds[i + 1] - bounds[i]),
                        dtype="float32",
                        always_2d=True,
                        out=out[bounds[i] : bounds[i + 1]],
                    )
                    return len(got)

            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(jobs) as ex:
                if sum(ex.map(part, range(jobs))) != n:
                    raise RuntimeError("short read")
            x, sr = out, info.samplerate
        else:
            x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except FileNotFoundError:
        raise DiarizationError(f"{path}: no such file") from None
    except DiarizationError:
        raise
    except (RuntimeError, sf.LibsndfileError, TypeError, ValueError) as e:
        raise DiarizationError(f"{path}: cannot read audio ({e})") from None
    if x.size == 0 or len(x) == 0:
        raise DiarizationError(f"{path}: the file contains no audio samples")
    x = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    if not np.all(np.isfinite(x)):
        raise DiarizationError(f"{path}: the audio contains NaN or infinite samples")
    return np.ascontiguousarray(x, dtype=np.float32), int(sr)


def _hz_to_mel(f):
    return 2595.0 * np.log10(1.0 + np.asarray(f, np.float64) / 700.0)


def _mel_to_hz(m):
    return 700.0 * (10.0 ** (np.asarray(m, np.float64) / 2595.0) - 1.0)


#: Frames (100 a second) above which the features use scipy.fft: its import (0.2 s on a quiet 2-core
#: machine) pays for itself after ~30 chunks of 1024 frames (NumPy's float32 FFT took 8 ms a chunk
#: against scipy's 1.5-3 ms), i.e. recordings of more than about 5 minutes.
SCIPY_FFT_FRAMES = 30_000


def mel_filterbank(sr: int, n_fft: int, n_mels: int = 40, fmin: float = 20.0, fmax: float = 8000.0) -> np.ndarray:
    """(n_fft // 2 + 1, n_mels) triangular filters equally spaced on the (HTK) mel scale, each of
    unit peak."""
    fmax = min(fmax, sr / 2.0)
    edges = _mel_to_hz(np.linspace(_hz_to_mel(fmin), _hz_to_mel(fmax), n_mels + 2))
    freqs = np.arange(n_fft // 2 + 1) * sr / n_fft
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    up = (freqs[None] - lo) / (mid - lo)
    down = (hi - freqs[None]) / (hi - mid)
    fb = np.maximum(0.0, np.minimum(up, down))
    return np.ascontiguousarray(fb.T.astype(np.float32))


def dct_matrix(n_in: int, n_out: int) -> np.ndarray:
    """(n_in, n_out) orthonormal DCT-II: ``log_mel @ dct_matrix`` gives c0..c{n_out-1}."""
    k = np.arange(n_out)[None, :]
    n = np.arange(n_in)[:, None]
    m = np.cos(np.pi * k * (2 * n + 1) / (2 * n_in)) * np.sqrt(2.0 / n_in)
    m[:, 0] /= np.sqrt(2.0)
    return m.astype(np.float32)


def compute_features(
    x: np.ndarray,
    sr: int,
    n_cep: int = 20,
    win: float = 0.025,
    hop: float = 0.010,
    n_mels: int = 40,
    n_jobs: int | None = None,
    chunk: int = 1024,
) -> Features:
    """Cepstra and log-energy of a mono signal. The frames are cut chunk by chunk (``chunk`` frames,
    a strided view of that chunk's samples with the zero padding of the signal's ends filled in
    only there: no padded copy of the whole signal), windowed, transformed (float32 throughout: by
    scipy.fft for recordings longer than :data:`SCIPY_FFT_FRAMES` frames, 5-8x faster per chunk; by
    NumPy's FFT for shorter ones, which then skip scipy.fft's 0.2-0.6 s import), and mapped to log-mel energies and
    cepstra by two matrix products. The chunks run on ``n_jobs`` threads (NumPy and pocketfft
    release the GIL), so the element-wise work spreads over the cores too, not only the FFT. Small
    chunks stay in cache: 1024 frames took 0.17 s for 30 minutes of audio, 16384 frames 0.78 s."""
    hop_len = int(round(hop * sr))
    win_len = int(round(win * sr))
    n_fft = 1 << (win_len - 1).bit_length()
    window = np.zeros(n_fft, np.float32)
    off = (n_fft - win_len) // 2
    window[off : off + win_len] = np.hamming(win_len + 1)[:-1]
    mel_t = mel_filterbank(sr, n_fft, n_mels)
    dct = dct_matrix(n_mels, n_cep)
    x = np.asarray(x, np.float32)
    pad = n_fft // 2
    n_padded = len(x) + 2 * pad
    T = 1 + (n_padded - n_fft) // hop_len if n_padded >= n_fft else 0
    cep = np.empty((T, n_cep), np.float32)
    log_energy = np.empty(T, np.float32)
    band_energy = np.empty(T, np.float32)
    b0, b1 = (min(n_fft // 2 + 1, int(np.ceil(f * n_fft / sr))) for f in SPEECH_BAND)
    jobs = n_jobs or default_jobs()
    if T > SCIPY_FFT_FRAMES:
        import scipy.fft

        def rfft(a):
            return scipy.fft.rfft(a, axis=1, workers=1)

    else:

        def rfft(a):
            return np.fft.rfft(a, axis=1)

    def one(start):
        stop = min(T, start + chunk)
        # samples [a, b) of the padded signal cover frames start..stop-1
        a, b = start * hop_len, (stop - 1) * hop_len + n_fft
        lo, hi = max(a - pad, 0), min(b - pad, len(x))
        if a - pad >= 0 and b - pad <= len(x):
            piece = x[lo:hi]
        else:  # an end of the signal: zeros where the padding is
            piece = np.zeros(b - a, np.float32)
            piece[lo - (a - pad) : hi - (a - pad)] = x[lo:hi]
        frames = np.lib.stride_tricks.as_strided(
            piece, (stop - start, n_fft), (piece.strides[0] * hop_len, piece.strides[0]), writeable=False
        )
        spec = rfft(frames * window)
        power = spec.real**2
        power += spec.imag**2
        log_energy[start:stop] = 10.0 * np.log10(power.sum(axis=1) + 1e-10)
        band_energy[start:stop] = 10.0 * np.log10(power[:, b0:b1].sum(axis=1) + 1e-10)
        log_mel = np.log(power @ mel_t + 1e-8)
        cep[start:stop] = log_mel @ dct

    starts = range(0, T, chunk)
    if jobs > 1 and len(starts) > 1:
        from concurrent.futures import ThreadPoolExecutor

        from threadpoolctl import threadpool_limits

        # the chunks' two small matrix products on one BLAS thread each: a threaded BLAS under every
        # chunk thread (16 x 16 threads on the GPU host) made 16 jobs 1.4-2.2x slower than one
        with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(min(jobs, len(starts))) as ex:
            list(ex.map(one, starts))
    else:
        for start in starts:
            one(start)
    return Features(cep, log_energy, len(x) / sr, band_energy=band_energy)


def deltas(x: np.ndarray, width: int = 2) -> np.ndarray:
    """Regression deltas over +-``width`` frames (edges repeated), as HTK/Kaldi."""
    T = len(x)
    xp = np.concatenate([np.repeat(x[:1], width, 0), x, np.repeat(x[-1:], width, 0)])
    out = np.zeros_like(x, dtype=np.float32)
    for k in range(1, width + 1):
        out += k * (xp[width + k : width + k + T] - xp[width - k : width - k + T])
    return out / (2.0 * sum(k * k for k in range(1, width + 1)))


def cmvn(x: np.ndarray, mask: np.ndarray | None = None, var: bool = True) -> np.ndarray:
    """Mean (and variance) normalisation with statistics over the frames in ``mask`` (all)."""
    ref = x[mask] if mask is not None else x
    mu = ref.mean(axis=0)
    out = x - mu
    if var:
        out /= ref.std(axis=0) + 1e-8
    return np.ascontiguousarray(out, dtype=np.float32)


def sliding_cmn(x: np.ndarray, mask: np.ndarray, width: int = 300) -> np.ndarray:
    """Subtract from every frame the mean of the speech frames (``mask``) in a window of ``width``
    frames centred on it (prefix sums: linear in the length)."""
    T, D = x.shape
    m = mask.astype(np.float64)
    c = np.zeros((T + 1, D))
    np.cumsum(x * m[:, None], axis=0, out=c[1:])
    n = np.concatenate([[0.0], np.cumsum(m)])
    h = width // 2
    lo = np.clip(np.arange(T) - h, 0, T)
    hi = np.clip(np.arange(T) + width - h, 0, T)
    cnt = np.maximum(n[hi] - n[lo], 1.0)
    mu = (c[hi] - c[lo]) / cnt[:, None]
    glob = x[mask].mean(axis=0) if mask.any() else x.mean(axis=0)
    # where the window holds little speech, lean on the recording's mean
    a = np.minimum(1.0, cnt / (0.3 * width))[:, None]
    return np.ascontiguousarray(x - (a * mu + (1 - a) * glob), dtype=np.float32)
