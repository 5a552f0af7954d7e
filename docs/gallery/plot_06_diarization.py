"""
Speaker diarization of the bundled meeting
==========================================

The showcase application (``examples/diarization/``): who spoke when in a two-minute generated
meeting of four speakers, with agglomerative clustering of speaker GMMs trained by asp_gmm and
merged by :func:`asp_gmm.compute_distance_BIC`. It prints the speed and the diarization error rate
against the reference (its "end to end" counts from the start of the process that ran it, here the
documentation build), and draws the timeline: reference speakers on top, the speakers found below
in the colour of the reference speaker they were matched to.
"""

import sys
import tempfile
from pathlib import Path

import matplotlib.image as mpimg
import matplotlib.pyplot as plt

try:
    ROOT = Path(__file__).resolve().parents[2]
except NameError:  # run where __file__ is not set (a notebook started in docs/gallery)
    ROOT = Path.cwd().resolve().parents[1]
EXAMPLE = ROOT / "examples" / "diarization"
sys.path.insert(0, str(EXAMPLE))

import diarize  # noqa: E402  (examples/diarization/diarize.py: the command line of the example)

out = Path(tempfile.mkdtemp())
audio, ref = EXAMPLE / "data" / "meeting.flac", EXAMPLE / "data" / "meeting.rttm"
status = diarize.main(
    [str(audio), "--ref", str(ref), "--rttm", str(out / "meeting.rttm"), "--plot", str(out / "timeline.png")]
)
if status != 0:  # the example printed why on stderr
    raise RuntimeError(f"examples/diarization/diarize.py failed (exit status {status}); see its message above")

# %%
# The RTTM it wrote (one line per speaker turn):
print("".join((out / "meeting.rttm").read_text().splitlines(keepends=True)[:6]) + "...")

# %%
# The timeline figure the example wrote with ``--plot``.
img = mpimg.imread(out / "timeline.png")
fig, ax = plt.subplots(figsize=(img.shape[1] / 100, img.shape[0] / 100), dpi=100)
ax.imshow(img)
ax.axis("off")
fig.subplots_adjust(0, 0, 1, 1)
plt.show()
