"""Quality: is a clip in sync? SyncNet's LSE-D / LSE-C and a weight-free mouth-follows-voice check.

- :func:`sync_score`: SyncNet v2 with the published ``syncnet_python`` evaluation protocol; needs the optional
  ``quality`` weight set (``syncnet/syncnet_v2.model``).
- :func:`mouth_audio_lag`: no weights; the inner-lip opening against the speech envelope.

Signs: ``SyncScore.offset_frames`` is syncnet_python's AV offset (positive = the sound comes *earlier* than the
picture); ``MouthAudioLag.lag_frames`` and ``SyncScore.audio_delay_frames`` are positive when the sound comes
*later*. Importing this package imports numpy only; torch loads when SyncNet is built.
"""

from __future__ import annotations

from .crops import protocol_crops, smooth_face_boxes
from .lag import MouthAudioLag, mouth_audio_lag, mouth_opening, speech_envelope
from .mfcc import mfcc
from .sync import VSHIFT, SyncScore, score_embeddings, sync_score
from .syncnet import SYNCNET_FILE, SyncEmbedder, load_syncnet, write_tiny_syncnet

__all__ = ["SYNCNET_FILE", "VSHIFT", "MouthAudioLag", "SyncEmbedder", "SyncScore", "load_syncnet", "mfcc",
           "mouth_audio_lag", "mouth_opening", "protocol_crops", "score_embeddings", "smooth_face_boxes",
           "speech_envelope", "sync_score", "write_tiny_syncnet"]
