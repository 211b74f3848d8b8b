"""The avatar: a prepared face that turns speech clips into video with the models of the pipeline it is handed.

Source: ``scripts/realtime_inference.py`` (docs/official-behaviour.md §9), with the last frame kept (quirk Q9) and
the offline feathering 0.05 by default, so an avatar's frames equal the offline job's (``blur_ratio=0.1`` gives the
official realtime one, quirk Q10).
"""

from __future__ import annotations

import contextlib
import dataclasses
import html
import os
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import gpu, media
from ..checks import check_path_type, speech_frames, warn_if_silent
from ..config import InferenceConfig
from ..constants import FPS, SAMPLE_RATE
from ..engine import SourceFaces, Timings, flush_denormals, render, run
from ..errors import CacheError, NbHelpersWarning, plural
from ..framestore import FrameStore
from ..result import ClipResult
from .cache import CACHED_FIELDS, FRAMES_FILE, LosslessFrames, check_files, read_arrays, read_manifest


@dataclass
class Avatar:
    """A prepared face (frames, crop boxes, latents, blend material), made by
    :func:`nbhelpers.avatar.prepare_avatar` or :meth:`load`.

    Attributes:
        directory: The cache folder.
        config: Settings it was prepared with (device, precision and batch size planned here).
        frame_shape: (H, W) of the frames in pixels.
        crop_boxes: (N, 4) int32 crop boxes, rows of -1 for frames without a face.
        has_face: (N,) bool.
        latents_np: (M, 8, 32, 32) float32 latents of the M frames with a face.
        squares: (M, 4) int32 expanded squares.
        masks: M feathered blend masks (2s, 2s) uint8.
        pipe: The :class:`~nbhelpers.pipeline.MuseTalkPipeline` whose models generate its clips.
        backend: Landmark backend it was prepared with.
        loaded_from_cache: True when nothing was recomputed.
        rebuild_reason: Why the cache was (re)built, or "" when loaded.
        prepare_timings: Wall seconds per stage of the preparation (empty when loaded): ``frames`` (decode, crop
            boxes), ``parser_wait``/``vae_wait`` (loading those), ``parse`` (masks), ``encode`` (latents),
            ``arrays``, ``frames_file`` (waiting for the lossless file and its hash), ``finish`` (manifest, reload).
    """

    directory: Path
    config: InferenceConfig
    frame_shape: tuple[int, int]
    crop_boxes: np.ndarray
    has_face: np.ndarray
    latents_np: np.ndarray
    squares: np.ndarray
    masks: list[np.ndarray]
    pipe: Any = field(repr=False)
    backend: str = ""
    loaded_from_cache: bool = False
    rebuild_reason: str = ""
    prepare_timings: dict[str, float] = field(default_factory=dict, repr=False)
    _frames: LosslessFrames | FrameStore | None = field(default=None, repr=False)
    _state: dict[str, Any] = field(default_factory=dict, repr=False)
    _kept: set[str] = field(default_factory=set, repr=False)
    _owns_pipe: bool = field(default=False, repr=False)

    @property
    def n_frames(self) -> int:
        """Source frames at 25 fps."""
        return int(len(self.has_face))

    @property
    def n_faces(self) -> int:
        """Source frames with a face."""
        return int(self.has_face.sum())

    def __str__(self) -> str:
        how = "loaded from cache" if self.loaded_from_cache else f"prepared ({self.rebuild_reason})"
        return (f"Avatar {self.directory.name}: {plural(self.n_frames, 'frame')} "
                f"{self.frame_shape[1]}x{self.frame_shape[0]}, {self.n_faces} with a face; {how}")

    def __repr__(self) -> str:
        return (f"Avatar({str(self.directory)!r}, {plural(self.n_frames, 'frame')}, {self.n_faces} with a face, "
                f"{self.frame_shape[1]}x{self.frame_shape[0]}, backend {self.backend or '?'!r})")

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(str(self))}</p>"

    # -- loading -------------------------------------------------------------------------------------------------

    @classmethod
    def load(cls, directory: str | os.PathLike, pipe: Any, *, config: InferenceConfig | None = None,
             check: bool = True) -> Avatar:
        """Load the avatar folder written by :func:`nbhelpers.avatar.prepare_avatar`, to generate with ``pipe``'s
        models, checking its format (and, with ``check``, every file's size and SHA-256). ``config`` overrides batch
        size, encoder and face restorer (cached fields must match the cache).

        Raises:
            CacheError: Not a complete, intact avatar of this format, or ``config`` differs in a cached field.
        """
        directory = Path(directory)
        meta = read_meta(directory, check=check)
        stored = stored_config(meta, config, directory)
        arrays = read_arrays(directory)
        return cls(directory=directory, config=stored, frame_shape=tuple(meta["frame_shape"]),
                   crop_boxes=arrays["crop_boxes"], has_face=arrays["has_face"], latents_np=arrays["latents"],
                   squares=arrays["squares"], masks=arrays["masks"], pipe=pipe, backend=str(meta.get("backend", "")),
                   loaded_from_cache=True)

    def frames(self) -> LosslessFrames | FrameStore:
        """The N source frames, read-only (H, W, 3) uint8 BGR by index: decoded on demand from the lossless file, or
        for an avatar just prepared its local raw copy (until :meth:`close` or until they are on the GPU)."""
        if self._frames is None:
            h, w = self.frame_shape
            self._frames = LosslessFrames(self.directory / FRAMES_FILE, self.n_frames, w, h)
        return self._frames

    # -- device state, shared by the jobs of this avatar ---------------------------------------------------------

    def device_state(self) -> dict[str, Any]:
        """The state every clip renders from, made once: ``source`` (:class:`~nbhelpers.engine.SourceFaces` on the
        pipeline's device), ``models`` (with the config's restorer) and ``clip_config`` (a whole clip's batch); the
        avatar's ``config`` gets the realtime batch (live sessions and :meth:`stream`)."""
        if "source" in self._state:
            return self._state
        import torch

        pipe = self.pipe
        asked = pipe.job_config(self.config.replace(device=None, fp16=None))
        with warnings.catch_warnings(record=True) as notes:
            warnings.simplefilter("always")
            self.config = pipe.plan("realtime", asked, None, self.frame_shape)
            # A whole clip into a file waits for no first frame: its own plan (kind "clip") allows larger batches.
            self._state["clip_config"] = pipe.plan("clip", asked, None, self.frame_shape)
        for note in {(n.category, str(n.message)): n.message for n in notes}.values():  # both plans' notes, once
            warnings.warn(note, NbHelpersWarning, stacklevel=2)  # a Warning instance keeps its own category
        latents = torch.from_numpy(self.latents_np).to(device=pipe.device, dtype=pipe.dtype)
        latent_row = np.full(self.n_frames, -1, dtype=np.int64)
        latent_row[np.flatnonzero(self.has_face)] = np.arange(self.n_faces)
        boxes = [tuple(int(v) for v in self.crop_boxes[j]) for j in np.flatnonzero(self.has_face)]
        source = SourceFaces(frames=self.frames(), latent_row=latent_row, latents=latents, boxes=boxes,
                             masks=self.masks, squares=[tuple(int(v) for v in s) for s in self.squares])
        source = source.to_device(pipe.device)
        if source.frames_device is not None and isinstance(self._frames, FrameStore):
            # frames on the GPU: free the raw copy, the lossless file serves later host reads
            self._frames.close()
            self._frames = None
            source = dataclasses.replace(source, frames=self.frames())
        self._state.update(source=source, models=pipe.models_for(self.config))
        return self._state

    def keep(self, key: str, make: Callable[[], Any]) -> Any:
        """The object ``key`` of the device state, made by ``make()`` on first use; :meth:`close` calls its
        ``close()`` if any."""
        if key not in self._state:
            self._state[key] = make()
            self._kept.add(key)
        return self._state[key]

    def optimize(self, timeout_s: float | None = None) -> Avatar:
        """Compile the UNet and VAE decoder for this avatar's clips and live sessions now (jobs do it in the
        background) and wait until ready or ``timeout_s`` passed; nothing on the CPU or with ``compile="off"``."""
        st = self.device_state()
        for config in (self.config, st.get("clip_config", self.config)):
            self.pipe.compile_for(int(config.batch_size or 20), parts=("unet", "decoder"))
        self.pipe.compiler.wait(timeout_s)
        return self

    def load_models(self) -> Avatar:
        """Load UNet, VAE, whisper and the cached arrays onto the device now, not in the first clip. Returns self."""
        self.device_state()
        self.pipe.features(np.zeros(SAMPLE_RATE // FPS, dtype=np.float32))  # whisper + feature extractor
        return self

    # -- generation ----------------------------------------------------------------------------------------------

    def _waveform(self, audio: str | os.PathLike | np.ndarray, timings: Timings) -> tuple[np.ndarray, int]:
        """The 16 kHz waveform and its output frames (InputError: read before any model loads or plans)."""
        with timings.stage("audio"):
            waveform = np.asarray(audio, dtype=np.float32) if isinstance(audio, np.ndarray) else media.load_audio(audio)
            what = "audio" if isinstance(audio, np.ndarray) else f"audio {str(audio)!r}"
            n_out = speech_frames(waveform, what)
            warn_if_silent(waveform, what)
        return waveform, n_out

    def generate(self, audio: str | os.PathLike | np.ndarray, output: str | os.PathLike | bool | None = None, *,
                 frame_callback: Callable[[int, np.ndarray], None] | None = None, encoder: str | None = None,
                 render_gate: Any = None) -> ClipResult:
        """Turn one speech clip into a :class:`~nbhelpers.result.ClipResult` (``kind="avatar"``) of this avatar.

        Args:
            audio: A speech file (any format ffmpeg reads) or a 16 kHz mono float32 waveform (no audio track then).
            output: An MP4 path; None: ``<avatar>/vid_output/<audio name>.mp4``; False: write nothing.
            frame_callback: Called as ``frame_callback(t, frame)`` with each finished (H, W, 3) uint8 BGR frame
                (copy it to keep it).
            encoder: A video encoder setting (:data:`nbhelpers.constants.ENCODERS`), chosen once per avatar; None:
                ``config.encoder``.
            render_gate: A lock or semaphore held while this clip renders (:func:`nbhelpers.engine.run`).

        Raises:
            InputError: The audio is missing, unreadable or shorter than one frame.
        """
        t0 = time.perf_counter()
        timings = Timings()
        from_file = not isinstance(audio, np.ndarray)
        if from_file:
            check_path_type(audio, "audio")
        if output is None:
            output = self.directory / "vid_output" / f"{Path(audio).stem if from_file else 'clip'}.mp4"
        if output is not False:  # before the models load
            check_path_type(output, "output")
            media.check_writable(Path(output).expanduser().parent)
        waveform, n_out = self._waveform(audio, timings)
        st = self.device_state()
        h, w = self.frame_shape
        clip_config = st.get("clip_config", self.config)
        batch = int(clip_config.batch_size or 20)
        self.pipe.compile_for(batch, parts=("unet", "decoder"))  # background; eager until ready
        with flush_denormals(st["models"].device):
            with timings.stage("audio"):
                features = self.pipe.features(waveform)
            writer = None
            if output is not False:
                setting = encoder or self.config.encoder
                if self._state.get("encoder_setting") != setting:
                    self._state.update(encoder_setting=setting, encoder=media.choose_encoder(setting))
                writer = media.VideoWriter(output, w, h, fps=FPS, audio=Path(audio) if from_file else None,
                                           encoder=self._state["encoder"])
            with contextlib.nullcontext() if writer is None else writer:
                run(st["source"], features, st["models"], batch, n_out, writer, frame_callback=frame_callback,
                    timings=timings, render_gate=render_gate)
            final = None if writer is None else Path(writer.path)
        return ClipResult(output=final, n_frames=n_out, source_frames=self.n_frames,
                          no_face_frames=self.n_frames - self.n_faces, fps=FPS,
                          duration_s=len(waveform) / SAMPLE_RATE, config=clip_config, backend=self.backend or "cache",
                          timings=dict(timings.seconds), wall_s=time.perf_counter() - t0, kind="avatar",
                          notes=self.pipe.clip_notes((w, h) if final is not None else None))

    def stream(self, audio: str | os.PathLike | np.ndarray) -> Iterator[np.ndarray]:
        """Yield the finished (H, W, 3) uint8 BGR frames of one clip, in order, as they are made (no file)."""
        waveform, n_out = self._waveform(audio, Timings())
        st = self.device_state()
        batch = int(self.config.batch_size or 20)
        self.pipe.compile_for(batch, parts=("unet", "decoder"))
        features = self.pipe.features(waveform)
        for _, frames in render(st["source"], features, st["models"], batch, n_out, pad_batches=True):
            yield from (np.array(f) for f in frames)

    def close(self) -> None:
        """Release the device arrays, decoded frames and :meth:`keep` objects; the models too when the avatar made
        its own pipeline (a pipeline passed in stays loaded)."""
        for key in self._kept:
            close = getattr(self._state.get(key), "close", None)
            if callable(close):
                close()
        self._kept.clear()
        self._state.clear()
        if self._frames is not None:
            self._frames.close()
            self._frames = None
        if self._owns_pipe:
            self.pipe.release()
            self._owns_pipe = False
        gpu.release()


def read_meta(directory: Path, *, check: bool = True) -> dict[str, Any]:
    """The manifest of the avatar in ``directory``, its files' hashes verified when ``check``; CacheError, saying how
    to prepare it again, unless it is a complete, intact avatar of this format."""
    try:
        meta = read_manifest(directory)
        if check:
            check_files(directory, meta)
    except CacheError as exc:
        raise CacheError(f"{exc}. Prepare the avatar there (again) with `python -m nbhelpers avatar prepare "
                         f"VIDEO {directory}` or nbhelpers.prepare_avatar(video, {str(directory)!r}); a damaged "
                         "or outdated avatar is rebuilt by preparing it again.") from exc
    return meta


#: The settings an avatar is run with that its cache does not depend on: ``load_avatar(config=...)`` takes them.
RUNTIME_FIELDS = ("device", "fp16", "batch_size", "compile", "encoder", "restore", "restore_strength")


def stored_config(meta: dict[str, Any], config: InferenceConfig | None, directory: Path) -> InferenceConfig:
    """The manifest's settings with ``config``'s device, precision, batch size, compile mode, encoder and restorer;
    CacheError when ``config`` differs in a cached field (an ``"auto"`` landmark backend matches any)."""
    stored = InferenceConfig(**meta["params"])
    if config is None:
        return stored
    diff = [f for f in CACHED_FIELDS if getattr(config, f) != getattr(stored, f)
            and not (f == "landmark_backend" and "auto" in (config.landmark_backend, stored.landmark_backend))]
    if diff:
        raise CacheError(f"the avatar in {directory} was prepared with other settings ({', '.join(diff)}); "
                         "prepare it again with prepare_avatar(..., config=...)")
    return stored.replace(**{f: getattr(config, f) for f in RUNTIME_FIELDS})


__all__ = ["Avatar"]
