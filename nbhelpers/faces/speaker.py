"""``speaker``: for ``face="speaker"``, which face track speaks in each stretch of speech.

A stretch is a run of loud output frames; it ends at a silence (at least ``MIN_SILENCE`` quiet frames) or at a cut. In
each stretch the speaker is the track whose mouth region changes most in step with the audio's loudness: the absolute
correlation between the audio's envelope and the main component of the track's mouth patches (the way
``quality.mouth_audio_lag`` relates mouth and audio, here with no lag and no landmarks), or, when the SyncNet weights
are there (:func:`syncnet_scorer`) and two or more tracks are in the stretch, the track with SyncNet's highest
confidence (LSE-C) over it. The speaker changes only where a stretch starts; quiet frames keep the speaker before them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import weights
from ..config import InferenceConfig, parse_face
from ..constants import FPS, SAMPLE_RATE
from ..errors import InputError, NoFaceError
from ..framestore import cycle_index
from ..quality.clip import frame_batches
from ..quality.crops import CROP_SIDE, protocol_crops, smooth_face_boxes
from ..quality.lag import pearson
from ..quality.mfcc import mfcc
from ..quality.sync import score_crops
from ..quality.syncnet import SYNCNET_FILE, load_syncnet
from .tracks import FaceTracks, Track

#: ``scorer(asks)``: per ask ``(candidates, first, sources)`` a confidence per candidate track (higher: more likely the
#: speaker) over output frames ``first``.. showing source frames ``sources``, or None to leave it to the correlation.
Scorer = Callable[[list[tuple[list[Track], int, np.ndarray]]], "list[list[float] | None]"]

SILENCE = 0.2  # a frame is quiet below this fraction of the clip's 95th-percentile envelope
MIN_SILENCE = 3  # quiet frames (120 ms) that end a stretch of speech
MIN_PRESENT = 0.5  # a track takes part in a stretch when its face is in at least this share of its frames
SYNCNET_FRAMES = 50  # SyncNet scores a stretch's first 2 s at most (the frames are held in memory at full size)


@dataclass(frozen=True)
class Turn:
    """Output frames ``first``..``last`` (inclusive) spoken by track ``track`` (-1: no face), with the ``score``
    that chose it, a correlation (``measure`` ``"r"``) or SyncNet's confidence (``"LSE-C"``)."""

    first: int
    last: int
    track: int
    score: float
    measure: str = "r"

    def __str__(self) -> str:
        who = f"track {self.track}" if self.track >= 0 else "no face"
        return f"{who} in frames {self.first}-{self.last} ({self.measure}={self.score:.2f})"


def envelope(waveform: np.ndarray, n_frames: int) -> np.ndarray:
    """(n_frames,) RMS loudness of a 16 kHz waveform per 25 fps output frame."""
    hop = SAMPLE_RATE // FPS
    part = np.asarray(waveform, dtype=np.float32)[: n_frames * hop]
    wave = np.pad(part, (0, n_frames * hop - len(part)))
    return np.sqrt((wave.reshape(n_frames, hop) ** 2).mean(axis=1))


def stretches(env: np.ndarray, boundaries: set[int] = frozenset()) -> list[tuple[int, int]]:
    """Runs ``(first, last)`` of loud frames, ended by ``MIN_SILENCE`` quiet frames or a frame in ``boundaries``
    (a cut starts there)."""
    loud = env > SILENCE * max(float(np.percentile(env, 95)), 1e-6)
    runs: list[tuple[int, int]] = []
    start, quiet = None, 0
    for t, on in enumerate(loud):
        if start is not None and t in boundaries:
            runs.append((start, t - 1 - quiet))
            start, quiet = None, 0
        if on:
            start = t if start is None else start
            quiet = 0
        elif start is not None:
            quiet += 1
            if quiet >= MIN_SILENCE:
                runs.append((start, t - quiet))
                start, quiet = None, 0
    if start is not None:
        runs.append((start, len(loud) - 1 - quiet))
    return [(a, b) for a, b in runs if b >= a]


def mouth_signal(track: Track, n_frames: int) -> np.ndarray:
    """(n_frames,) the main component of the track's mouth patches per source frame, NaN where it is absent."""
    out = np.full(n_frames, np.nan)
    if track.mouths is None or len(track) < 2:
        return out
    patches = track.mouths - track.mouths.mean(axis=0)
    _, _, vt = np.linalg.svd(patches, full_matrices=False)
    keep = track.frames < n_frames
    out[track.frames[keep]] = (patches @ vt[0])[keep]
    return out


def speaker_schedule(tracks: FaceTracks, env: np.ndarray, source_of: np.ndarray,
                     scorer: Scorer | None = None) -> tuple[np.ndarray, list[Turn]]:
    """Who speaks: per source frame the track of ``tracks`` to repaint (-1: none), and the turns per output frame, from
    the (T,) loudness ``env`` per output frame (:func:`envelope`), the (T,) source frame each shows, and the tracks'
    ``mouths`` patches; ``scorer`` (:data:`Scorer`, called once) decides the stretches with two or more candidates."""
    signals = {t.number: mouth_signal(t, tracks.n_frames)[source_of] for t in tracks}
    cut_frames = set(tracks.cuts)
    runs = stretches(env, {t for t in range(1, len(source_of)) if int(source_of[t]) in cut_frames})
    scores, measures = [{} for _ in runs], ["r"] * len(runs)
    for (first, last), found in zip(runs, scores, strict=True):
        for number, signal in signals.items():
            part = signal[first:last + 1]
            present = np.isfinite(part)
            if present.mean() >= MIN_PRESENT and present.sum() >= 3:
                found[number] = abs(pearson(part[present], env[first:last + 1][present]))
    asks = [k for k, found in enumerate(scores) if len(found) > 1] if scorer is not None else []
    confidences = scorer([([tracks[n] for n in scores[k]], runs[k][0], source_of[runs[k][0]:runs[k][1] + 1])
                          for k in asks]) if asks else []
    for k, confidence in zip(asks, confidences, strict=True):
        if confidence is not None:
            scores[k], measures[k] = dict(zip(scores[k], confidence, strict=True)), "LSE-C"
    turns = []
    for (first, last), found, measure in zip(runs, scores, measures, strict=True):
        best = max(found, key=found.__getitem__, default=-1)
        turns.append(Turn(first, last, best, max(found.get(best, 0.0), 0.0), measure))
    per_output = np.full(len(source_of), turns[0].track if turns else -1, dtype=np.int64)
    for turn in turns:  # a turn lasts until the next one starts (quiet frames keep the speaker)
        per_output[turn.first:] = turn.track
    schedule = np.full(tracks.n_frames, -1, dtype=np.int64)
    shown, first_shown = np.unique(source_of, return_index=True)  # a frame shown twice keeps its first speaker
    schedule[shown] = per_output[first_shown]
    return schedule, turns


def syncnet_scorer(video: Any, waveform: np.ndarray, weights_dir: str | os.PathLike | None = None,
                   device: Any = None) -> Scorer | None:
    """A :data:`Scorer` giving each candidate track's SyncNet LSE-C over a stretch's first 2 s: its boxes (gaps
    interpolated) cut into the published protocol's crops of those frames of ``video``, against the MFCCs of the
    16 kHz ``waveform`` (:func:`nbhelpers.quality.sync.score_crops`), all asks' crops cut in one pass over ``video``.
    None when ``weights_dir`` (None: the default) lacks ``syncnet/syncnet_v2.model``. A stretch under 6 frames, or a
    track missing from more than 25 frames in a row of it, leaves the stretch to the correlation."""
    root = weights.resolve_dir(weights_dir)
    if not (root / SYNCNET_FILE).is_file():
        return None
    model, cc = load_syncnet(root, device), mfcc(np.asarray(waveform, dtype=np.float32), SAMPLE_RATE)

    def score(asks: list[tuple[list[Track], int, np.ndarray]]) -> list[list[float] | None]:
        out: list[list[float] | None] = [None] * len(asks)
        cuts, wanted = {}, {}  # ask -> (first, squares (C, n, 3), crops, last source); source -> [(ask, position)]
        for k, (candidates, first, sources) in enumerate(asks):
            sources = np.asarray(sources[:SYNCNET_FRAMES]).tolist()
            with contextlib.suppress(InputError, NoFaceError):  # a gap of more than 25 frames
                squares = np.stack([smooth_face_boxes([[np.nan] * 4 if (box := track.box_at(s)) is None else box
                                                       for s in sources]) for track in candidates])
                cuts[k] = first, squares, np.empty((*squares.shape[:2], CROP_SIDE, CROP_SIDE, 3), "uint8"), max(sources)
                for p, source in enumerate(sources):
                    wanted.setdefault(source, []).append((k, p))
        for n, frame in enumerate(itertools.chain.from_iterable(frame_batches(video, 16)) if cuts else ()):
            for k, p in (kp for kp in wanted.get(n, ()) if kp[0] in cuts):
                _, squares, crops, _ = cuts[k]
                try:  # InputError: an empty crop
                    crops[:, p] = protocol_crops(np.broadcast_to(frame, (len(crops), *frame.shape)), squares[:, p])
                except InputError:
                    del cuts[k]
            for k in [k for k, cut in cuts.items() if cut[3] == n]:  # every frame of ask k is cut
                first, _, crops, _ = cuts.pop(k)
                with contextlib.suppress(InputError):  # under 6 frames
                    out[k] = [score_crops(c, cc[:, 4 * first:], model).lse_c for c in crops]
            if not cuts:
                break
        return out

    return score


def choose_face(config: InferenceConfig, find: Callable[[], FaceTracks], waveform: np.ndarray | None = None,
                n_out: int = 0, scorer: Scorer | None = None) -> tuple[InferenceConfig, np.ndarray | None, list[Turn]]:
    """Settle what a job's tracker cannot settle frame by frame, with ``find()`` (one detector pass over the video) only
    when needed: a point or box in a later frame than 0 becomes its track number; ``"speaker"`` (with the 16 kHz
    ``waveform`` of ``n_out`` output frames, and ``scorer`` for :func:`speaker_schedule`) becomes a schedule per source
    frame and its turns, recorded in ``config.reasons["face"]``. Returns ``(config, schedule or None, turns)``."""
    choice = parse_face(config.face)
    if choice.kind in ("point", "box") and choice.frame > 0:
        number = find().select(choice)
        resolved = config.replace(face=number)
        resolved.reasons["face"] = f"{choice} is track {number}"
        return resolved, None, []
    if choice.kind != "speaker" or waveform is None:
        return config, None, []
    tracks = find()
    source_of = np.asarray(cycle_index(np.arange(n_out), tracks.n_frames))
    schedule, turns = speaker_schedule(tracks, envelope(waveform, n_out), source_of, scorer)
    config.reasons["face"] = "speaker: " + "; ".join(map(str, turns))
    return config, schedule, turns
