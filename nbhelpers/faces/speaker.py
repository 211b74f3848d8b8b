"""``speaker``: for ``face="speaker"``, which face track speaks in each stretch of speech.

A stretch is a run of loud output frames; it ends at a silence (at least ``MIN_SILENCE`` quiet frames) or at a cut.
In each stretch the speaker is the track whose mouth region changes most in step with the audio's loudness: the
absolute correlation between the audio's envelope and the main component of the track's mouth patches (the way
``quality.mouth_audio_lag`` relates mouth and audio, here with no lag and no landmarks). The speaker changes only
where a stretch starts; quiet frames keep the speaker before them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..config import InferenceConfig, parse_face
from ..constants import FPS, SAMPLE_RATE
from ..framestore import cycle_index
from .tracks import FaceTracks, Track

SILENCE = 0.2  # a frame is quiet below this fraction of the clip's 95th-percentile envelope
MIN_SILENCE = 3  # quiet frames (120 ms) that end a stretch of speech
MIN_PRESENT = 0.5  # a track takes part in a stretch when its face is in at least this share of its frames


@dataclass(frozen=True)
class Turn:
    """Output frames ``first``..``last`` (inclusive) spoken by track ``track`` (-1: no face), with the
    correlation ``score`` that chose it."""

    first: int
    last: int
    track: int
    score: float

    def __str__(self) -> str:
        who = f"track {self.track}" if self.track >= 0 else "no face"
        return f"{who} in frames {self.first}-{self.last} (r={self.score:.2f})"


def envelope(waveform: np.ndarray, n_frames: int) -> np.ndarray:
    """(n_frames,) RMS loudness of a 16 kHz waveform per 25 fps output frame."""
    hop = SAMPLE_RATE // FPS
    wave = np.zeros(n_frames * hop, dtype=np.float32)
    part = np.asarray(waveform, dtype=np.float32)[: n_frames * hop]
    wave[: len(part)] = part
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


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    den = float(np.sqrt((a * a).sum() * (b * b).sum()))
    return float(abs((a * b).sum()) / den) if den > 0 else 0.0


def speaker_schedule(tracks: FaceTracks, env: np.ndarray, source_of: np.ndarray) -> tuple[np.ndarray, list[Turn]]:
    """Who speaks: per source frame the track to repaint (-1: none), and the turns per output frame.

    Args:
        tracks: The clip's face tracks (their ``mouths`` patches).
        env: (T,) loudness per output frame (:func:`envelope`).
        source_of: (T,) the source frame each output frame shows.
    """
    signals = {t.number: mouth_signal(t, tracks.n_frames)[source_of] for t in tracks}
    cut_frames = set(tracks.cuts)
    boundaries = {t for t in range(1, len(source_of)) if int(source_of[t]) in cut_frames}
    turns: list[Turn] = []
    for first, last in stretches(env, boundaries):
        best, best_score = -1, -1.0
        for number, signal in signals.items():
            part = signal[first:last + 1]
            present = np.isfinite(part)
            if present.mean() < MIN_PRESENT or present.sum() < 3:
                continue
            score = _corr(part[present], env[first:last + 1][present])
            if score > best_score:
                best, best_score = number, score
        turns.append(Turn(first, last, best, max(best_score, 0.0)))
    per_output = np.full(len(source_of), turns[0].track if turns else -1, dtype=np.int64)
    for turn in turns:  # a turn lasts until the next one starts (quiet frames keep the speaker)
        per_output[turn.first:] = turn.track
    schedule = np.full(tracks.n_frames, -1, dtype=np.int64)
    seen = np.zeros(tracks.n_frames, dtype=bool)
    for t, src in enumerate(source_of):  # a source frame shown twice (ping-pong) keeps its first speaker
        if not seen[src]:
            schedule[src], seen[src] = per_output[t], True
    return schedule, turns


def choose_face(config: InferenceConfig, find: Callable[[], FaceTracks], waveform: np.ndarray | None = None,
                n_out: int = 0) -> tuple[InferenceConfig, np.ndarray | None, list[Turn]]:
    """Settle what a job's tracker cannot settle frame by frame, with ``find()`` (one detector pass over the video)
    only when needed: a point or box in a later frame than 0 becomes its track number; ``"speaker"`` (with the
    16 kHz ``waveform`` of ``n_out`` output frames) becomes a schedule per source frame and its turns, recorded in
    ``config.reasons["face"]``. Returns ``(config, schedule or None, turns)``."""
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
    schedule, turns = speaker_schedule(tracks, envelope(waveform, n_out), source_of)
    config.reasons["face"] = "speaker: " + "; ".join(map(str, turns))
    return config, schedule, turns
