"""Audio loading, MFCC features and energy-based speech activity detection for the diarizer.

Frames: 25 ms window, 10 ms hop (100 frames/s), frame ``i`` centred on ``i * 10 ms``.
Features: 19 MFCCs (c1..c19 of a 40-band log-mel spectrum; c0, the frame energy, is left out so that
loudness differences between turns do not split speakers), mean/variance normalised over the speech
frames of the recording. Speech activity: frame log-energy against an adaptive threshold between
the recording's noise floor and speech level, then gap closing and short-burst removal.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FRAME_RATE = 100  # frames per second (10 ms hop)


class DiarizationError(Exception):
    """A problem with the input that the user can fix: reported as one line, exit status 2."""


@dataclass
class Features:
    mfcc: np.ndarray        # (T, 19) float32, normalised over speech frames
    speech: np.ndarray      # (T,) bool
    log_energy: np.ndarray  # (T,) float32, dB
    duration: float         # seconds of audio
    frame_rate: int = FRAME_RATE


def load_audio(path) -> tuple[np.ndarray, int]:
    """Read WAV/FLAC/OGG (anything libsndfile reads) at its own rate; stereo is mixed down."""
    import soundfile as sf
    try:
        x, sr = sf.read(str(path), dtype="float32", always_2d=True)
    except FileNotFoundError:
        raise DiarizationError(f"{path}: no such file") from None
    except (RuntimeError, sf.LibsndfileError, TypeError, ValueError) as e:
        raise DiarizationError(f"{path}: cannot read audio ({e})") from None
    if x.size == 0 or len(x) == 0:
        raise DiarizationError(f"{path}: the file contains no audio samples")
    x = x.mean(axis=1) if x.shape[1] > 1 else x[:, 0]
    if not np.all(np.isfinite(x)):
        raise DiarizationError(f"{path}: the audio contains NaN or infinite samples")
    return np.ascontiguousarray(x, dtype=np.float32), int(sr)


def _close_gaps(mask: np.ndarray, max_gap: int, min_run: int) -> np.ndarray:
    """Fill False runs shorter than max_gap frames inside speech, then drop True runs < min_run."""
    m = mask.copy()
    for value, limit in ((False, max_gap), (True, min_run)):
        if limit <= 0:
            continue
        d = np.diff(np.concatenate([[not value], m == value, [not value]]).astype(np.int8))
        starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
        for s, e in zip(starts, ends):
            if e - s < limit and (value or (s > 0 and e < len(m))):
                m[s:e] = not value
    return m


def speech_activity(log_energy: np.ndarray, threshold: float = 0.35, min_range_db: float = 8.0,
                    max_gap: float = 0.15, min_speech: float = 0.1) -> np.ndarray:
    """Energy-based speech/non-speech decision per frame.

    The threshold sits at ``threshold`` of the way from the noise floor (10th percentile of frame
    log-energy) to the speech level (95th percentile). A recording whose level spread is under
    ``min_range_db`` has no speech (silence, or stationary noise) and gets an all-False mask.
    """
    lo, hi = np.percentile(log_energy, [10, 95])
    if hi - lo < min_range_db:
        return np.zeros(len(log_energy), bool)
    mask = log_energy > lo + threshold * (hi - lo)
    return _close_gaps(mask, int(round(max_gap * FRAME_RATE)), int(round(min_speech * FRAME_RATE)))


def compute_features(x: np.ndarray, sr: int, n_mfcc: int = 19, win: float = 0.025,
                     hop: float = 0.010, n_mels: int = 40, vad_threshold: float = 0.35) -> Features:
    import librosa
    hop_len = int(round(hop * sr))
    win_len = int(round(win * sr))
    n_fft = 1 << (win_len - 1).bit_length()
    if sr * hop != hop_len:
        pass  # frame rate stays ~100/s; times are computed with FRAME_RATE
    spec = np.abs(librosa.stft(x, n_fft=n_fft, hop_length=hop_len, win_length=win_len,
                               window="hamming", center=True)) ** 2
    log_energy = 10.0 * np.log10(spec.sum(axis=0) + 1e-10)
    mel_fb = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=20.0,
                                 fmax=min(sr / 2.0, 8000.0))
    log_mel = np.log(mel_fb @ spec + 1e-10)
    # DCT-II (orthonormal) of the log-mel spectrum; keep c1..c{n_mfcc}.
    import scipy.fft
    ceps = scipy.fft.dct(log_mel, type=2, axis=0, norm="ortho")[1: n_mfcc + 1].T
    speech = speech_activity(log_energy, vad_threshold)
    ref = ceps[speech] if speech.sum() > 1 else ceps
    mu = ref.mean(axis=0)
    sd = ref.std(axis=0) + 1e-8
    mfcc = ((ceps - mu) / sd).astype(np.float32)
    return Features(np.ascontiguousarray(mfcc), speech, log_energy.astype(np.float32), len(x) / sr)
