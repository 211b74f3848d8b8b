"""Decoding audio: any file to 16 kHz mono float32, with soundfile where it can, else through ffmpeg."""

from __future__ import annotations

import contextlib
import wave
from pathlib import Path

import numpy as np

from ..constants import SAMPLE_RATE
from ..errors import InputError, NoAudioError, require
from ..hashing import atomic_path
from .ffmpeg import QUIET, _existing_file, _Process, ffmpeg_exe
from .probing import MediaInfo, probe

_PCM_FORMATS = {"WAV", "WAVEX", "RF64", "W64", "AIFF", "CAF", "FLAC", "AU"}  # libsndfile formats with exact counts


def _soundfile_read(p: Path) -> tuple[np.ndarray, int] | None:
    """(channels-first float32 or 1-D, native rate) through libsndfile, exactly as librosa does; None if it can't."""
    try:
        import soundfile as sf

        with sf.SoundFile(str(p)) as handle:
            return handle.read(frames=-1, dtype="float32", always_2d=False).T, int(handle.samplerate)
    except Exception:  # no libsndfile, or it cannot read this format (mp4/m4a/video...) -> ffmpeg
        return None


def _wav_header(buf: bytes) -> tuple[int, int, int] | None:
    """(channels, sample rate, offset of the sample data) from a streamed WAV header; None until complete."""
    if len(buf) < 12:
        return None
    if buf[:4] not in (b"RIFF", b"RF64") or buf[8:12] != b"WAVE":
        raise ValueError("not a WAV stream")
    pos, channels, rate = 12, None, None
    while pos + 8 <= len(buf):
        chunk, size = buf[pos:pos + 4], int.from_bytes(buf[pos + 4:pos + 8], "little")
        if chunk == b"data":
            if channels is None:
                raise ValueError("WAV data before fmt")
            return channels, rate, pos + 8
        if pos + 8 + size > len(buf):
            return None
        if chunk == b"fmt ":
            channels = int.from_bytes(buf[pos + 10:pos + 12], "little")
            rate = int.from_bytes(buf[pos + 12:pos + 16], "little")
        pos += 8 + size + (size & 1)
    return None


def _ffmpeg_decode(p: Path, info: MediaInfo) -> tuple[np.ndarray, int]:
    """Decode the first audio stream at its native rate to float32, mean-mixed to mono chunk by chunk."""
    proc = _Process([ffmpeg_exe(), *QUIET, "-i", str(p), "-map", f"0:{info.audio_stream.index}", "-vn", "-sn", "-dn",
                     "-map_metadata", "-1", "-fflags", "+bitexact", "-c:a", "pcm_f32le", "-f", "wav", "pipe:1"])
    stdout = proc.popen.stdout
    try:
        head, header = b"", None
        while header is None and (more := stdout.read1(65536)):  # stdout is a BufferedReader
            head += more
            header = _wav_header(head)
        if header is None:
            proc.wait()
            raise proc.error(f"ffmpeg produced no audio samples from {str(p)!r}.")
        channels, rate, offset = header
        pieces, pending = [], head[offset:]
        while True:
            usable = len(pending) - len(pending) % (4 * channels)  # whole frames of float32 samples
            block = np.frombuffer(pending[:usable], dtype="<f4").reshape(-1, channels)
            # librosa's to_mono: mean over the channel axis of the channels-first array (exact for one channel)
            pieces.append(block.astype(np.float32).T.mean(axis=0))
            more = stdout.read(1 << 20)
            if not more:
                break
            pending = pending[usable:] + more
        if proc.wait() != 0:
            raise proc.error(f"ffmpeg failed while decoding the audio of {str(p)!r}.")
    finally:
        proc.kill()
    return np.concatenate(pieces), rate


def _decode_native(path, param: str) -> tuple[np.ndarray, int]:
    """Mono float32 at the native rate, as librosa.load(sr=None) gives it: (samples (L,), rate Hz)."""
    p = _existing_file(path, param)
    got = _soundfile_read(p)
    if got is not None:
        data, rate = got
        mono = np.mean(data, axis=tuple(range(data.ndim - 1))) if data.ndim > 1 else data
    else:
        info = probe(p, count_frames=False)
        if not info.has_audio:
            raise NoAudioError(param, str(p), info)
        mono, rate = _ffmpeg_decode(p, info)
    if mono.size == 0:
        raise InputError(f"{param}: {str(p)!r} has an audio stream but no samples (0 s of sound). Record or export "
                         "the speech again, or use the demo clip from nbhelpers.media.demo_inputs().")
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)


def load_audio(path, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Decode speech to ``(L,)`` float32 mono samples (nominally -1..1) at ``sample_rate`` Hz, as ``librosa.load``.

    As librosa 0.11 does, without librosa: soundfile at the native rate (else ffmpeg's first audio stream),
    channels averaged, ``soxr.resample(..., quality="soxr_hq")``, length ``ceil(L * sample_rate / native_rate)``.
    ``path`` is any file with an audio stream (speech, or a video with sound).
    Raises InputError: missing file, no audio stream, zero samples, or a bad ``sample_rate``; FFmpegError: ffmpeg cannot
    read the file; MissingDependencyError: ``soxr`` is not installed and resampling is needed.
    Source: ``audio_processor.py:18``; ``[librosa] core/audio.py:56-66,170-193``; docs/official-behaviour.md §2.2."""
    if not isinstance(sample_rate, (int, np.integer)) or isinstance(sample_rate, bool) or sample_rate <= 0:
        raise InputError(f"sample_rate must be a positive integer in Hz (Whisper needs {SAMPLE_RATE}); got "
                         f"{sample_rate!r}.")
    mono, rate = _decode_native(path, "audio")
    if rate == sample_rate:
        return mono
    soxr = require("soxr", "pip install soxr")
    n_out = int(np.ceil(mono.shape[-1] * (float(sample_rate) / rate)))  # librosa.resample's fix_length size
    out = np.asarray(soxr.resample(mono, rate, int(sample_rate), quality="soxr_hq"), dtype=np.float32)[:n_out]
    return np.ascontiguousarray(np.pad(out, (0, n_out - out.shape[0])), dtype=np.float32)


def audio_duration(path) -> float:
    """Exact duration in seconds of the first audio stream of ``path``: samples / native rate.
    Raises InputError: missing file, no audio stream or no samples; FFmpegError: ffmpeg cannot read the file.
    Source: the output has ``floor(seconds * 25)`` frames (``audio_processor.py:61-63``)."""
    p = _existing_file(path, "audio")
    with contextlib.suppress(Exception):  # not readable by libsndfile -> decode with ffmpeg
        import soundfile as sf

        info = sf.info(str(p))
        # PCM containers state their sample count in the header; compressed ones are decoded to count exactly
        if info.format in _PCM_FORMATS and info.frames > 0 and info.samplerate > 0:
            return info.frames / info.samplerate
    mono, rate = _decode_native(p, "audio")
    return mono.shape[0] / rate


def cut_audio(audio, seconds: float, path) -> Path:
    """Write the first ``seconds`` of ``audio`` (as :func:`load_audio` decodes it) to ``path``, atomically, as a 16 kHz
    mono 16-bit PCM WAV, and return ``path``; a 16 kHz mono 16-bit source keeps its samples exactly."""
    part = load_audio(audio)[:int(seconds * SAMPLE_RATE)]
    path = Path(path)
    with atomic_path(path, ".wav") as tmp, wave.open(str(tmp), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(SAMPLE_RATE)
        out.writeframes(np.clip(np.round(part * 32768), -32768, 32767).astype("<i2").tobytes())
    return path
