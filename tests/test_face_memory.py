"""A pipeline finds the faces of one video once (issue 37 #5): a preview and then a lip-sync, a second speech over
the same video, other crop settings and an avatar of it ask the landmark backend nothing again; counted in the
detector's calls."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from nbhelpers.faces.base import FaceResult


class CountingBackend:
    """A face in the middle of a 96x96 frame, whatever the pixels; counts the frames it is asked about."""

    name = "counting"

    def __init__(self):
        self.frames = 0

    def detect(self, frames):
        self.frames += len(frames)
        lm = np.tile(np.array([48.0, 55.0], np.float32), (68, 1))
        lm[0], lm[16], lm[8] = (25, 45), (71, 45), (48, 85)
        lm[28], lm[29], lm[30] = (48, 45), (48, 50), (48, 55)
        return [FaceResult(face_box=np.array([20.0, 20, 76, 88]), landmarks=lm.copy(), score=0.9) for _ in frames]

    def close(self):
        pass


@pytest.mark.notorch
def test_remembered_frames_are_not_asked_again(tmp_path):
    from nbhelpers.faces.memory import DetectionMemory

    video = tmp_path / "v.mp4"
    video.write_bytes(b"frames")
    memory, real = DetectionMemory(), CountingBackend()
    frames = np.zeros((5, 96, 96, 3), np.uint8)
    assert len(memory.wrap(real, video, 2).detect(frames[:1])) == 1 and real.frames == 1  # frame 2
    assert len(memory.wrap(real, video).detect(frames)) == 5 and real.frames == 5  # 0, 1, 3, 4 asked; 2 remembered
    memory.wrap(real, video).detect(frames[:3])
    assert real.frames == 5 and memory.detected == 5
    copy = tmp_path / "copy.mp4"  # the same content under another name: the same detections
    shutil.copy(video, copy)
    memory.wrap(real, copy).detect(frames)
    assert real.frames == 5
    video.write_bytes(b"other frames")  # changed content: asked again
    memory.wrap(real, video).detect(frames[:2])
    assert real.frames == 7
    assert memory.wrap("auto", video) == "auto"  # boxes given: nothing to remember


@pytest.mark.slow
def test_preview_then_lipsync_on_one_pipeline_tracks_the_video_once(make_media, tiny_weights, tmp_path):
    import nbhelpers as nbh

    video = make_media("testsrc-96-8f.mp4", "-f", "lavfi", "-i", "testsrc=size=96x96:rate=25", "-frames:v", "8",
                       "-pix_fmt", "yuv420p")
    speech = make_media("sine-0.4s.wav", "-f", "lavfi", "-i", "sine=frequency=300:duration=0.4")
    other = make_media("sine-0.6s.wav", "-f", "lavfi", "-i", "sine=frequency=500:duration=0.6")
    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=4))
    real = CountingBackend()
    pipe.preview(video, backend=real)
    assert real.frames == 1
    first = pipe.lipsync(video, speech, tmp_path / "a.mp4", backend=real)
    assert real.frames == 8 and first.source_frames == 8  # frame 0 was remembered from the preview
    pipe.lipsync(video, other, tmp_path / "b.mp4", backend=real,
                 config=nbh.InferenceConfig(batch_size=4, bbox_shift=3, extra_margin=4))
    pipe.preview(video, backend=real, frame_index=5)
    avatar = nbh.prepare_avatar(video, tmp_path / "avatar", pipe, backend=real)
    assert real.frames == 8  # other speech, other crop settings, another preview and an avatar: no detection
    assert avatar.n_faces == 8
