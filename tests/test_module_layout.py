"""The packages made from modules that mixed concerns (issue 13, ``tools/split_modules.py``).

Each of ``gpu``, ``weights``, ``env`` and ``media`` is a package whose submodules own one concern each (module
docstring first, at most 700 lines), every name of the former flat module (listed below, as it was when the
split was made) is still importable from the package, every name a submodule holds is the package's same object,
and setting a name on the package reaches the submodules that use it (what ``monkeypatch.setattr`` relies on).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nbhelpers"
MAX_LINES = 700

pytestmark = pytest.mark.notorch

# Made by tools/split_modules.py: the namespace of each former module (defined names and its imports).
FORMER_NAMES = {
    "env": [
        "ALTERNATIVES", "AUDIO_SUFFIXES", "Any", "CI_CLIP_SECONDS", "COLAB_EXTRA", "DIST_NAME", "DRIVE_MOUNTPOINT",
        "DriveStatus", "EnvReport", "FPS", "InputError", "InstallReport", "InstallRow", "Iterable",
        "MEDIA_LICENCES", "MODES", "MediaError", "NEVER_INSTALL", "NbHelpersError", "ONNX_ONLY", "PROTECTED",
        "Path", "REPORTED", "RESTART_MESSAGE", "ResultCheckError", "SHARED_AUDIO", "SHARED_AUDIO_2", "SHARED_VIDEO",
        "Sequence", "WORKBOOK_AUDIO", "WORKBOOK_VIDEO", "_DISTS", "_SESSION_START", "_check_file", "_check_mode",
        "_checkout_extra", "_cut", "_default_inputs", "_demo", "_device_summary", "_ffmpeg", "_first_attr",
        "_first_number", "_normalise", "_same_version", "_source_fingerprint", "_weights_path", "check_result",
        "check_setup", "colab_requirements", "dataclass", "default_config", "drive_mounted", "field", "functools",
        "hashlib", "html", "importlib", "in_colab", "install_missing", "keep_audio", "media_dir", "media_seconds",
        "metadata", "mount_drive", "os", "package_version", "plan", "re", "read_requirements", "restart_reasons",
        "run_mode", "sample_audios", "setup", "shared_data_dir", "shlex", "shutil", "subprocess", "sys", "tempfile",
        "time", "upload", "weights_dir", "work_dir", "workbook_inputs",
    ],
    "gpu": [
        "ALLOCATOR_SETTING", "AUDIO_TOKENS", "Any", "COLAB_GPU_STEPS", "CPU_TIMES", "Callable", "CpuTimes",
        "DEFAULT_FRAME_SIZE", "FallbackWarning", "GIB", "GpuProcess", "GpuReport", "InputError", "Iterator",
        "KINDS", "LATENT_CHANNELS", "LATENT_SIZE", "MEMORY_MODEL", "MemoryModel", "MissingDependencyError",
        "NVIDIA_SMI_TIMEOUT_S", "NbHelpersError", "NbHelpersWarning", "NoGpuError", "OutOfMemoryError",
        "PeakMemory", "Plan", "PlanWarning", "StageMemory", "T", "TypeVar", "WEIGHTS", "WHISPER_DIM", "_PEAK_SEEN",
        "_batched", "_cpu_batch", "_cuda", "_device_index", "_driver_info", "_duration", "_empty_cache",
        "_env_flag", "_fit_batch", "_gpu_budget", "_host_ram_gib", "_in_colab", "_no_cuda_message", "_number",
        "_nvidia_smi_info", "_nvml_free", "_nvml_info", "_read_report", "_read_torch_cuda", "_release_one", "_remember_peak",
        "_run_nvidia_smi", "_same_uuid", "batched", "cast_and_move", "check_device", "check_gpu", "contextmanager",
        "cpu_seconds", "dataclass", "dataclasses", "empty_cache", "field", "free_memory_by_index", "gc", "html", "is_oom", "math",
        "memory_scope", "numbers", "os", "peak_memory", "plan", "platform", "prefer_expandable_segments", "release",
        "report", "reset_peak", "shutil", "snap_batch", "stage_memory", "subprocess", "sys", "warnings",
    ],
    "media": [
        "Any", "ENCODERS", "ENCODER_SETTINGS", "EncoderChoice", "FFmpegError", "FPS", "FallbackWarning", "Fraction",
        "InputError", "Iterable", "Iterator", "MediaError", "MediaInfo", "MissingDependencyError", "Path",
        "SAMPLE_RATE", "SYNTHETIC_TAG", "Sequence", "StreamInfo", "VideoReader", "VideoWriter",
        "WRITER_STALL_TIMEOUT_S", "_ALPHA_PIX_FMTS", "_CHANNEL_LAYOUTS", "_DURATION_RE", "_EXIF_ROTATION",
        "_FrameStream", "_IMAGE_CODECS", "_KILL_WAIT_S", "_MATRIX_RE", "_PCM_FORMATS", "_PIPE_CHUNK", "_PROBE_SIZE",
        "_Process", "_ROTATE_TAG_RE", "_STDERR_TAIL_LINES", "_STREAM_RE", "_Stalled", "_WRITER_SUFFIXES",
        "_apply_orientation", "_bundled_ffmpeg", "_channel_count", "_check_background", "_check_fps",
        "_count_packets", "_decode_native", "_exif_orientation", "_existing_file", "_ffmpeg_decode",
        "_flatten_alpha", "_fps_text", "_has_alpha", "_parse_ffmpeg_info", "_parse_rate", "_parse_stream",
        "_parse_version", "_passthrough", "_probe_cache", "_probe_lock", "_progress_frames", "_replace",
        "_rotation_cw", "_run", "_soundfile_read", "_split_top", "_tail", "_wav_header", "audio_duration",
        "choose_encoder", "collections", "convert_to_25fps", "dataclass", "demo_inputs", "ffmpeg_exe",
        "ffmpeg_version", "frames_at", "functools", "html", "load_audio", "load_video", "np", "nvenc_probe", "os",
        "probe", "re", "read_frame", "selectors", "shutil", "subprocess", "threading", "time", "uuid",
    ],
    "weights": [
        "ATTEMPTS_PER_SOURCE", "Any", "BAD_STATES", "CORRUPT", "DEFAULT_SETS", "DOWNLOAD_COMMAND", "DRIVE_DIR",
        "DownloadReport", "DownloadRow", "ENV_VAR", "Expected", "Fact", "FileCheck", "FileTable", "HASH_MISMATCH",
        "HF_MIRROR", "HTML_PAGE", "HTTP_TIMEOUT_S", "InputError", "Inspection", "Iterable", "LFS_POINTER",
        "MANIFEST", "MISSING", "Manifest", "NOTEBOOK", "NbHelpersWarning", "OK", "Path", "RETRY_DELAY_S", "SETS",
        "STAGING_DIR", "STATE_FILE", "Sequence", "Source", "TINY_MARKER", "TRUNCATED", "TRY_TINY", "UNVERIFIABLE",
        "VerifyReport", "WRONG_SIZE", "WeightFile", "WeightsError", "_ALIASES", "_AUTO_ORDER", "_CHUNK", "_DWPOSE",
        "_ELEMENT_BYTES", "_ENTRIES", "_FORMAT_BY_SUFFIX", "_GB", "_HOSTS", "_LANDMARK_SETS", "_LFS_PREFIX",
        "_MUSETALK", "_Rejected", "_STATE_COLOURS", "_SkimUnpickler", "_Skipped", "_State", "_Stub", "_Unreachable",
        "_VAE", "_WHISPER", "_accept", "_auto_landmark_sets", "_check", "_check_host", "_default_endpoint",
        "_discard_staged", "_download_one", "_expected", "_failure_message", "_fetch", "_fetch_bundled",
        "_fetch_gdrive", "_fetch_hub", "_fetch_plain", "_fetch_url", "_fix", "_holds_weights", "_html_table",
        "_hub", "_human", "_inspect_json", "_inspect_legacy_torch", "_inspect_onnx", "_inspect_safetensors",
        "_inspect_torch", "_looks_html", "_offline", "_on_colab", "_permanent", "_same_dir", "_set_arg", "_short",
        "_staging", "_text_table", "_varint", "check_job_files", "dataclasses", "default_dir", "download",
        "drive_dir", "expected_facts", "hashlib", "html", "importlib", "inspect_file", "is_tiny", "job_files",
        "json", "list_files", "main", "missing_files", "os", "pickle", "re", "required_files", "sha256_file",
        "shutil", "struct", "sys", "time", "verify", "warnings", "zipfile",
    ],
}


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_each_split_module_is_a_package_of_documented_submodules(name):
    folder = PACKAGE / name
    assert not (PACKAGE / f"{name}.py").exists(), f"nbhelpers/{name}.py is back beside the package"
    assert (folder / "__init__.py").is_file()
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 3, files
    for path in files:
        source = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source))
        assert doc and len(doc.split()) >= 5, f"{path.name}: no module docstring saying what it owns"
        lines = source.count("\n")
        assert path.name == "__init__.py" or lines <= MAX_LINES, f"{path.name}: {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_every_former_name_is_importable_from_the_package(name):
    package = importlib.import_module(f"nbhelpers.{name}")
    missing = [n for n in FORMER_NAMES[name] if not hasattr(package, n)]
    assert not missing, f"nbhelpers.{name} lost {missing}"


def _submodules(package):
    return [importlib.import_module(f"{package.__name__}.{sub}") for sub in package._SUBMODULES]


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_every_name_of_a_submodule_is_the_same_object_on_the_package(name):
    package = importlib.import_module(f"nbhelpers.{name}")
    for module in _submodules(package):
        for attr, value in vars(module).items():
            if attr.startswith("__") and attr.endswith("__"):
                continue
            assert getattr(package, attr, None) is value, f"{module.__name__}.{attr} is not nbhelpers.{name}.{attr}"


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_setting_a_name_on_the_package_reaches_every_submodule_that_uses_it(name, monkeypatch):
    package = importlib.import_module(f"nbhelpers.{name}")
    modules = _submodules(package)
    names = sorted({attr for m in modules for attr in vars(m) if not attr.startswith("__")})
    assert names
    for attr in names:
        before = {m.__name__: vars(m)[attr] for m in modules if attr in vars(m)}
        holders = [m for m in modules if vars(m).get(attr, None) is getattr(package, attr)]
        sentinel = object()
        monkeypatch.setattr(package, attr, sentinel)
        assert getattr(package, attr) is sentinel
        for m in holders:
            assert vars(m)[attr] is sentinel, f"{m.__name__}.{attr} did not see the patch"
        monkeypatch.undo()
        after = {m.__name__: vars(m)[attr] for m in modules if attr in vars(m)}
        assert after == before and all(after[k] is before[k] for k in before), attr


def test_a_helper_patched_on_the_package_is_what_a_caller_in_another_submodule_uses(monkeypatch):
    from nbhelpers import gpu

    class Reached(Exception):
        pass

    def fake_report():
        raise Reached

    # plan() (gpu/planner.py) reads the device report through _read_report (gpu/device.py).
    monkeypatch.setattr(gpu, "_read_report", fake_report)
    with pytest.raises(Reached):
        gpu.plan("lipsync")
    monkeypatch.undo()
    assert gpu.planner._read_report is gpu.device._read_report is gpu.report


def test_the_packages_import_without_torch():
    code = ("import sys, nbhelpers, nbhelpers.gpu, nbhelpers.weights, nbhelpers.media, nbhelpers.env; "
            "bad = [m for m in ('torch', 'huggingface_hub', 'matplotlib', 'ipywidgets', 'cv2') if m in sys.modules]; "
            "print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_python_m_weights_still_runs_the_weights_command_line():
    proc = subprocess.run([sys.executable, "-m", "nbhelpers.weights", "--help"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "list" in proc.stdout and "download" in proc.stdout and "verify" in proc.stdout
