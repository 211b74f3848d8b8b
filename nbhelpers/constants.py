"""Fixed numbers of MuseTalk, with units and the official file:line (docs/official-behaviour.md §14)."""

from __future__ import annotations

FPS = 25  # frames per second of every video the pipeline handles (training data was made at 25 fps, README.md:320)
SAMPLE_RATE = 16_000  # Hz, whisper's input rate (audio_processor.py:18)
CROP_SIZE = 256  # pixels, side of the face crop fed to the VAE (inference.py:173-174)
LATENT_SIZE = 32  # latent pixels, CROP_SIZE // 8 (vae.py:118)
LATENT_CHANNELS = 8  # masked (4) + reference (4) latent channels (vae.py:110-122)
VAE_SCALING = 0.18215  # sd-vae-ft-mse has no scaling_factor in its config; diffusers' default (vae.py:35)
WHISPER_FPS = 50  # whisper encoder frames per second (20 ms each)
WHISPER_LAYERS = 5  # hidden states of whisper-tiny's encoder: embeddings + 4 layers (modeling_whisper)
WHISPER_DIM = 384  # whisper-tiny d_model
AUDIO_WINDOW = 10  # encoder frames per video frame, 2 * (pad_left 2 + pad_right 2 + 1) (audio_processor.py:48)
AUDIO_TOKENS = AUDIO_WINDOW * WHISPER_LAYERS  # 50 tokens of 384 per video frame
SEGMENT_SECONDS = 30  # whisper segment length in seconds (audio_processor.py:21-22)
SEGMENT_SAMPLES = SEGMENT_SECONDS * SAMPLE_RATE  # 480_000 samples
PARSING_SIZE = 512  # pixels, side of the face-parsing input (face_parsing/__init__.py:71-75)
VERSIONS = ("v15", "v1")  # MuseTalk 1.5 (default) and 1.0 weights through the current pipeline
# Video encoder settings (nbhelpers.media.ENCODER_SETTINGS maps them to ffmpeg options): libx264 CRF 18 at a
# preset (the official offline job: medium, inference.py:230-237), or h264_nvenc after a one-frame test encode.
ENCODERS = ("libx264", "libx264-fast", "libx264-faster", "libx264-veryfast", "libx264-superfast",
            "libx264-ultrafast", "auto", "nvenc")
COMPILE_MODES = ("auto", "on", "off")  # torch.compile (nbhelpers.gpu.compile): where it pays, wherever it runs, never
LATENT_MODES = ("sample", "mode")  # VAE posterior: a sample (official inference, vae.py:93) or its mean
