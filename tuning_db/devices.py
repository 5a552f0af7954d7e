"""Device fingerprints: one type per backend, with the fields the history stores.

A backend describes its device as a plain dict (``Backend.fingerprint()``); :func:`device_of` reads it
into the backend's type, which says which field fills which column of the ``devices`` table. No key
is guessed: a CPU's ``threads`` are its hardware threads (the threads one call used are a property of
the run and are stored with the timing), a GPU's ``cores`` column holds its SM count and its ``isa``
column its compute capability.

This module imports nothing (neither SQLAlchemy nor ``asp_gmm``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass


def device_id(fingerprint: dict) -> str:
    """sha256 (first 16 hex digits) of the fingerprint's sorted JSON: the device part of every key."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]


def _text(v, limit: int) -> str:
    return (",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v if v is not None else ""))[:limit]


def _count(v) -> int:
    s = str(v)
    return int(s) if s.isdigit() and len(s) < 10 else 0  # fits the Integer column


@dataclass(frozen=True)
class DeviceFingerprint:
    """Fields common to every device: the backend, the model, the compiler version."""

    backend: str
    model: str = ""
    compiler: str = ""

    def columns(self) -> dict:
        """The ``devices`` row's columns (model, isa, cores, driver, compiler)."""
        return dict(
            backend=_text(self.backend, 32),
            model=_text(self.model, 256),
            isa="",
            cores=0,
            driver="",
            compiler=_text(self.compiler, 512),
        )


@dataclass(frozen=True)
class CpuFingerprint(DeviceFingerprint):
    """A CPU (backends ``c`` and ``numpy``).

    Attributes
    ----------
    model : str
        The CPU model name.
    isa : tuple of str
        The vector ISA extensions that matter to the compiled code (avx2, fma, avx512f, ...).
    threads : int
        Hardware threads of the machine (not the threads a call used: those are stored per timing).
    arch : str
        ``platform.machine()``.
    """

    isa: tuple = ()
    threads: int = 0
    arch: str = ""

    def columns(self) -> dict:
        return {**super().columns(), "isa": _text(list(self.isa), 512), "cores": _count(self.threads)}


@dataclass(frozen=True)
class CudaFingerprint(DeviceFingerprint):
    """An NVIDIA GPU (backend ``cuda``).

    Attributes
    ----------
    model : str
        The device name (e.g. "NVIDIA H100 80GB HBM3").
    cc : str
        Compute capability as the backend writes it (``arch``, e.g. "sm_90").
    sm_count : int
        Streaming multiprocessors.
    memory : int
        Global memory in bytes.
    driver : str
        CUDA driver version.
    """

    cc: str = ""
    sm_count: int = 0
    memory: int = 0
    driver: str = ""

    def columns(self) -> dict:
        return {
            **super().columns(),
            "isa": _text(self.cc, 512),
            "cores": _count(self.sm_count),
            "driver": _text(self.driver, 256),
        }


def device_of(fp: dict) -> DeviceFingerprint:
    """The typed fingerprint of a backend's fingerprint dict (by its ``backend`` key)."""
    fp = fp if isinstance(fp, dict) else {}
    backend = str(fp.get("backend", ""))
    model, compiler = str(fp.get("model", "")), str(fp.get("compiler", ""))
    if backend == "cuda":
        return CudaFingerprint(
            backend,
            model,
            compiler,
            cc=str(fp.get("arch", "")),
            sm_count=_count(fp.get("sm_count", 0)),
            memory=int(fp["memory"]) if str(fp.get("memory", "")).isdigit() else 0,
            driver=str(fp.get("driver", "")),
        )
    if backend in ("c", "numpy"):
        isa = fp.get("isa", ())
        return CpuFingerprint(
            backend,
            model,
            compiler,
            isa=tuple(isa) if isinstance(isa, (list, tuple)) else (str(isa),),
            threads=_count(fp.get("threads", 0)),
            arch=str(fp.get("arch", "")),
        )
    return DeviceFingerprint(backend, model, compiler)
