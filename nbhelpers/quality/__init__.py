"""Quality: is a clip in sync? SyncNet's LSE-D / LSE-C and a weight-free mouth-follows-voice check.

This package measures the audio-visual sync of a finished (or source) clip; it renders nothing
(:func:`nbhelpers.ui.plot_sync` draws a :class:`MouthAudioLag`).

- :func:`sync_score` (``sync``): the field's measure, SyncNet v2 (Chung & Zisserman, "Out of time", 2016) run with
  the published evaluation protocol of ``syncnet_python``: face crops (``crops``), MFCCs (``mfcc``), the network
  (``network``, loaded by ``syncnet``) and the offset search. It needs the optional ``quality`` weight set
  (``syncnet/syncnet_v2.model``).
- :func:`mouth_audio_lag` (``lag``): no weights. The inner-lip opening per frame against the speech envelope,
  and the lag where they correlate best.

Both take the embedding/landmark step as an argument (``model=``, ``track=``) so the protocol can be tested with
injected models, and both return a result dataclass that shows itself.

Sign conventions (the two measures report opposite signs, as their sources do):

- ``SyncScore.offset_frames`` is syncnet_python's "AV offset": video window ``i`` matches audio window
  ``i - offset``; positive = the sound comes *earlier* than the picture.
- ``MouthAudioLag.lag_frames``: positive = the sound comes *later* than the mouth (the audio is delayed).
  ``SyncScore.audio_delay_frames`` (= -offset) is on this scale.

Importing this package imports numpy only; torch and the network (:class:`nbhelpers.quality.network.SyncNetV2`)
are loaded when SyncNet is built.
"""

from __future__ import annotations

from .crops import protocol_crops, smooth_face_boxes
from .lag import MouthAudioLag, mouth_audio_lag, mouth_opening, speech_envelope
from .mfcc import mfcc
from .sync import VSHIFT, SyncScore, score_embeddings, sync_score
from .syncnet import SYNCNET_FILE, SyncEmbedder, load_syncnet, write_tiny_syncnet

__all__ = [
    "SYNCNET_FILE",
    "VSHIFT",
    "MouthAudioLag",
    "SyncEmbedder",
    "SyncScore",
    "load_syncnet",
    "mfcc",
    "mouth_audio_lag",
    "mouth_opening",
    "protocol_crops",
    "score_embeddings",
    "smooth_face_boxes",
    "speech_envelope",
    "sync_score",
    "write_tiny_syncnet",
]
