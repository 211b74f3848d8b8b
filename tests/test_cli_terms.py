"""The command line speaks in its own terms (issue 14, item 11): flag names instead of Python names, no pointers to
notebooks, a weights folder that is not there said so, and a batch size larger than the job or than memory named
as such instead of being echoed as the batch used."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from helpers import CPU_ONLY, T4
from helpers import run_cli as cli

from nbhelpers import gpu
from nbhelpers.cli.terms import cli_terms
from nbhelpers.config import InferenceConfig
from nbhelpers.errors import InputError
from nbhelpers.gpu import PlanWarning

PYTHON_WORDS = ("batch_size", "or None", "weights_dir=", "notebook", "config.device", "landmark_backend")


def assert_cli_words(text: str) -> None:
    for word in PYTHON_WORDS:
        assert word not in text, f"{word!r} in a command-line message: {text}"


@pytest.mark.parametrize("field, value, flag", [
    ("batch_size", 0, "--batch-size must be a whole number of frames >= 1 or auto (automatic, the default); got 0."),
    ("extra_margin", 500, "--extra-margin must be a whole number of pixels from 0 to 200; got 500."),
    ("left_cheek_width", -1, "--left-cheek-width must be a whole number of pixels from 0 to 256"),
    ("smooth_boxes", -2, "--smooth-boxes must be a whole number of frames >= 0"),
    ("seed", -1, "--seed must be a whole number >= 0 and < 2**63; got -1."),
    ("device", "gpu", "--device must be 'cuda', 'cuda:N' (N = 0, 1, ...), 'cpu' or auto (automatic, the default)"),
    ("landmark_backend", "face", "--backend must be one of"),
])
def test_settings_errors_name_the_flag(field, value, flag):
    with pytest.raises(InputError) as caught:
        InferenceConfig(**{field: value})
    text = cli_terms(str(caught.value))
    assert flag in text
    assert_cli_words(text)


@pytest.mark.parametrize("argv, line", [
    (["lipsync", "v.mp4", "a.wav", "--extra-margin", "500"],
     "--extra-margin must be a whole number of pixels from 0 to 200; got 500."),
    (["lipsync", "v.mp4", "a.wav", "--blur-ratio", "x"], "--blur-ratio must be a finite number > 0 and <= 0.5; got "
                                                         "'x' (text)."),
    (["avatar", "live", "{dir}", "--audio", "a.wav", "--delay-s", "nan"],
     "--delay-s must be a finite number of seconds >= 0; got nan."),
    (["avatar", "live", "{dir}", "--audio", "a.wav", "--hop", "0"], "--hop must be a whole number of frames >= 1"),
    (["batch", "missing.csv", "--cpu-workers", "0"], "--cpu-workers must be a whole number >= 1; got 0."),
    (["lipsync", "v.mp4", "a.wav", "--batch-size", "2.5"],  # a decimal is a number, not text
     "--batch-size must be a whole number of frames >= 1 or auto (automatic, the default); got 2.5."),
    (["avatar", "live", "{dir}", "--audio", "a.wav", "--chunk-ms", "0"], "--chunk-ms must be > 0; got 0."),
    (["lipsync", "v.mp4", "a.wav", "--device", "AUTO"],  # the refusal names the spelling that is taken
     "--device must be 'cuda', 'cuda:N' (N = 0, 1, ...), 'cpu' or auto (automatic, the default); got 'AUTO'."),
])
def test_a_refused_setting_of_every_config_is_one_line_naming_its_flag(argv, line, tmp_path, capsys):
    """Each config checks its fields when made; the command line says which flag, before reading any file."""
    from nbhelpers.cli.main import main

    assert main([a.replace("{dir}", str(tmp_path)) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: {line}") and err.count("\n") == 1 and err.endswith("\n")  # one line
    assert "Traceback" not in err and not out


def test_cli_errors_for_files_and_weights_are_in_cli_terms(tmp_path, grey_clip, tone_1s):
    missing = cli("lipsync", tmp_path / "nope.mp4", tone_1s, "--weights", tmp_path)
    assert missing.returncode == 2 and "nope.mp4' does not exist" in missing.stderr
    assert "give the full path, or a path relative to the current folder" in missing.stderr
    assert_cli_words(missing.stderr)

    bad_batch = cli("lipsync", grey_clip, tone_1s, "--batch-size", "0")
    assert bad_batch.returncode == 2 and "--batch-size must be a whole number of frames >= 1" in bad_batch.stderr
    assert_cli_words(bad_batch.stderr)

    nowhere = tmp_path / "no weights here"
    gone = cli("lipsync", grey_clip, tone_1s, "-o", tmp_path / "out.mp4", "--weights", nowhere, "--backend", "dlib",
               "--device", "cpu")
    assert gone.returncode == 2, gone.stderr
    assert f"the weights folder '{nowhere}' does not exist" in gone.stderr
    assert "missing" not in gone.stderr and "--weights DIR or the NBHELPERS_WEIGHTS" in gone.stderr
    assert_cli_words(gone.stderr)


def test_the_gpu_message_names_the_flag():
    from nbhelpers.gpu.device import _no_cuda_message

    text = cli_terms(_no_cuda_message("cuda:1"))
    assert text.startswith("--device is 'cuda:1' but no CUDA GPU is usable")
    assert "Or leave --device out (automatic), or pass --device cpu." in text
    assert_cli_words(text)


@pytest.mark.notorch
def test_a_batch_longer_than_the_job_is_the_whole_job_not_echoed():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PlanWarning)
        p = gpu.plan("lipsync", report=CPU_ONLY, config=InferenceConfig(batch_size=100000), n_frames=50)
    assert p.batch_size == 50 and p.config.batch_size == 50  # what the job's summary reports
    assert p.reasons["batch_size"].startswith("50: user override (100000) is more than the job's 50 frames")
    on_gpu = gpu.plan("lipsync", report=T4, config=InferenceConfig(batch_size=100000), n_frames=20)
    assert on_gpu.batch_size == 20


@pytest.mark.notorch
def test_the_faster_backend_of_a_long_cpu_job_is_named_as_its_flag_and_value():
    with pytest.warns(PlanWarning) as caught:
        gpu.plan("lipsync", report=CPU_ONLY, n_frames=188, frame_size=(768, 576), weights="tiny")
    text = cli_terms(str(caught[0].message))
    assert "; with --backend dlib (dlib's landmarks, not DWPose's) about 3 min. " in text
    assert_cli_words(text)


@pytest.mark.notorch
def test_a_cpu_batch_that_host_ram_cannot_hold_is_warned_about_in_flag_names():
    with pytest.warns(PlanWarning) as caught:
        p = gpu.plan("lipsync", report=CPU_ONLY, config=InferenceConfig(batch_size=1000), n_frames=5000)
    assert p.batch_size == 1000
    [ram] = [str(w.message) for w in caught if "host RAM" in str(w.message)]
    assert ram.startswith("batch_size 1000 (user override) is predicted to need ")
    assert "above the 7.5 GiB usable" in ram and "the plan would choose 4)" in ram
    assert cli_terms(ram).startswith("--batch-size 1000 (user override) is predicted")
    with pytest.warns(PlanWarning, match="batch_size 16 .* no faster"):
        gpu.plan("lipsync", report=CPU_ONLY, config=InferenceConfig(batch_size=16), n_frames=100, weights="tiny")


def test_a_download_failure_names_the_weights_flag_once_with_its_dir(tmp_path):
    # the offline message lists --weights DIR, weights_dir= and NBHELPERS_WEIGHTS; the CLI has two of those, and a
    # rewrite of weights_dir= alone left "--weights DIR on the command line, --weights  in Python" (new-user trial)
    done = cli("download", "--weights", tmp_path / "w", "--sets", "s3fd",
               env={"HF_HUB_OFFLINE": "1", "NBHELPERS_PROGRESS": "0"})
    assert done.returncode == 2, done.stderr
    [fix] = [line for line in done.stderr.splitlines() if line.startswith("Fix:")]
    assert "or point the job at a folder that already holds them: --weights DIR or the NBHELPERS_WEIGHTS " \
           "environment variable (a shared Google Drive folder works)." in fix
    assert "  " not in fix and "in Python" not in fix and "on the command line" not in fix
    assert_cli_words(done.stderr)


@pytest.mark.parametrize("message, expected", [
    ("Or copy the files by hand and pass --weights DIR (weights_dir=, NBHELPERS_WEIGHTS).",
     "Or copy the files by hand and pass --weights DIR (or the NBHELPERS_WEIGHTS environment variable)."),
    ("or pass weights_dir= the folder that holds the official models/ layout.",
     "or pass --weights DIR, the folder that holds the official models/ layout."),
    ("(the official layout), e.g. weights_dir='models'", "(the official layout), e.g. --weights 'models'"),
    ("but no weights dir is known (pass weights_dir=)", "but no weights dir is known (pass --weights DIR)"),
])
def test_weights_dir_becomes_the_flag_with_its_dir(message, expected):
    assert cli_terms(message) == expected


def test_the_other_download_failure_message_in_cli_terms(tmp_path):
    from nbhelpers.weights.downloads import DownloadRow, _failure_message
    from nbhelpers.weights.manifest import MANIFEST

    entry = next(iter(MANIFEST))
    row = DownloadRow(entry.name, entry.path, "failed", "", None, 0.0, "HTTP 503 from the host")
    text = cli_terms(_failure_message(tmp_path, [row], MANIFEST))
    assert text.endswith("Or copy the files by hand and pass --weights DIR (or the NBHELPERS_WEIGHTS environment "
                         "variable).")
    assert_cli_words(text)


def test_a_weights_folder_that_cannot_be_written_is_named_as_the_flag(tmp_path, capsys):
    """``download --weights /proc/x`` said "pass directory=", the Python argument of weights.download."""
    from nbhelpers.cli.main import main

    (tmp_path / "afile").write_text("x")
    assert main(["download", "--weights", str(tmp_path / "afile" / "w"), "--sets", "s3fd"]) == 2
    err = capsys.readouterr().err
    assert "Choose a writable folder (--weights DIR or the NBHELPERS_WEIGHTS environment variable), or ask" in err
    assert "directory=" not in err and "in Python" not in err
    assert_cli_words(err)


def test_score_without_syncnet_weights_says_so_in_cli_terms(grey_clip, tone_1s, tmp_path, capsys, monkeypatch):
    """score caught the missing-weights error and printed it as raised: "pass weights_dir= the folder" and
    "mouth_audio_lag needs no weights"."""
    from nbhelpers import quality
    from nbhelpers.cli.main import main

    class Lag:
        def summary(self):
            return "mouth-audio lag +0 frames"

    monkeypatch.setattr(quality, "mouth_audio_lag", lambda *a, **k: Lag())
    assert main(["score", str(grey_clip), "--audio", str(tone_1s), "--weights", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert err.startswith("LSE-D / LSE-C not computed: the SyncNet weights are missing")
    assert err.endswith("(or pass --weights DIR, the folder that holds syncnet/syncnet_v2.model). The mouth-audio lag "
                        "needs no weights.\n")
    assert "mouth_audio_lag" not in err
    assert_cli_words(err)
    (tmp_path / "tiny.json").write_text("{}")  # a folder of tiny test weights: not where real ones should go
    assert main(["score", str(grey_clip), "--audio", str(tone_1s), "--weights", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"{tmp_path} holds tiny random test weights" in err and "download --sets quality` (into " in err
    assert f"--weights {tmp_path}" not in err
    assert_cli_words(err)


@pytest.mark.parametrize(("backend", "said"), [
    ("dwpose", "`python -m nbhelpers download --weights {dir} --sets faces`, or pass --weights DIR, the folder that "
               "holds dwpose/."),
    ("dwpose-onnx", "`python -m nbhelpers download --weights {dir} --sets faces-onnx`, or pass --weights DIR, the "
                    "folder that holds it.")])
def test_score_without_landmark_weights_names_the_flag_and_the_folder(backend, said, grey_clip, tone_1s, tmp_path,
                                                                      capsys):
    """score checks no job files first, so the backend's own message reached the user: "pass the weights_dir that
    holds dwpose/", "(or weights.download(sets=['faces-onnx']))", and a download command whose ``--weights DIR`` was
    a placeholder (dwpose) or missing, so that it filled the default folder instead of the one given (dwpose-onnx)."""
    pytest.importorskip("torch" if backend == "dwpose" else "onnxruntime")
    from nbhelpers.cli.main import main

    assert main(["score", str(grey_clip), "--audio", str(tone_1s), "--backend", backend, "--weights",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert said.format(dir=tmp_path) in err and "weights_dir" not in err and "weights.download" not in err
    assert "--weights DIR --sets" not in err
    assert_cli_words(err)


def test_score_on_a_cuda_device_this_runtime_lacks_stops_as_a_job_does(grey_clip, tone_1s, monkeypatch, capsys):
    """score --device cuda without a usable CUDA GPU is the one-line error lipsync gives, before any frame is read,
    not a run on the CPU; the Python functions behind it raise NoGpuError the same way."""
    import torch

    from nbhelpers import quality
    from nbhelpers.cli.main import main
    from nbhelpers.gpu import NoGpuError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["score", str(grey_clip), "--audio", str(tone_1s), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --device is 'cuda' but no CUDA GPU is usable") and err.count("\n") == 1, err
    assert_cli_words(err)
    for score in (quality.mouth_audio_lag, quality.sync_score):
        with pytest.raises(NoGpuError, match="'cuda:1' but no CUDA GPU"):
            score(str(grey_clip), str(tone_1s), device="cuda:1")


def test_score_finding_no_face_offers_what_score_takes(grey_clip, tone_1s, capsys):
    """The tracker's hint offered --box, a flag score does not have: the lag follows the mouth's landmarks, which a
    crop box does not give."""
    pytest.importorskip("dlib")
    from nbhelpers.cli.main import main

    assert main(["score", str(grey_clip), "--audio", str(tone_1s), "--backend", "dlib", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no face found in the 25 frames (landmark backend 'dlib'")
    assert err.endswith("try another --backend (score takes no crop box: the mouth-audio lag follows the face's "
                        "landmarks).\n")
    assert "--box" not in err and "boxes" not in err
    assert_cli_words(err)


def test_score_without_mmpose_gives_the_shell_command_that_installs_it(grey_clip, tone_1s, capsys):
    """The message named a Python call and a notebook, nothing a shell runs."""
    import importlib.util

    if importlib.util.find_spec("mmcv") is not None:
        pytest.skip("mmcv is installed here")
    from nbhelpers.cli.main import main

    assert main(["score", str(grey_clip), "--audio", str(tone_1s), "--backend", "mmpose"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: mmcv (or mmcv-lite) is not installed. mmpose is not importable. Install it with `python -c "
                   "\"from nbhelpers.faces.mim import install_mmpose; print(install_mmpose())\"` (mim and pip; torch "
                   "and numpy stay as they are), or pass --backend dwpose, which gives the same landmarks without "
                   "mmcv.\n")
    assert_cli_words(err)


def test_lipsync_reports_a_missing_audio_file_before_the_weights(grey_clip, tmp_path, capsys):
    """The weights folder was checked first, so a typo in the audio name read as missing weights."""
    from nbhelpers.cli.main import main

    audio = tmp_path / "speech.wav"
    assert main(["lipsync", str(grey_clip), str(audio), "--weights", str(tmp_path / "no weights")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: audio {str(audio)!r} does not exist") and "weights" not in err


def test_lipsync_reports_a_box_outside_the_frame_before_the_weights(grey_clip, tone_1s, tmp_path, capsys):
    """A user without weights who typed a box outside the frame was first sent to download the weights, then told
    the box was wrong."""
    from nbhelpers.cli.main import main

    assert main(["lipsync", str(grey_clip), str(tone_1s), "--weights", str(tmp_path / "no weights"),
                 "--box=0,0,500,500"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --box=0,0,500,500 does not fit the frame") and "weights" not in err, err


def test_score_says_of_its_files_what_lipsync_says(tmp_path, grey_clip, capsys):
    """score's own checks said "audio file not found: 'x.wav'" where lipsync says "audio 'x.wav' does not exist.
    Check the path", and named a silent video by its absolute path."""
    from nbhelpers.cli.main import main

    gone = tmp_path / "gone.wav"
    assert main(["score", str(grey_clip), "--audio", str(gone), "--backend", "dlib"]) == 2
    assert capsys.readouterr().err.startswith(f"error: audio {str(gone)!r} does not exist. Check the path")
    assert main(["lipsync", str(grey_clip), str(gone), "--weights", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: audio {str(gone)!r} does not exist. Check the path")


def test_score_of_a_photo_says_a_still_has_no_sync(tmp_path, tone_1s, capsys):
    """``score PHOTO.png`` asked for --audio, and with --audio said "1 frames are too few ... or a smaller max_lag",
    a Python argument."""
    import cv2

    from nbhelpers import quality
    from nbhelpers.cli.main import main

    photo = tmp_path / "face.png"
    cv2.imwrite(str(photo), np.full((64, 64, 3), 128, np.uint8))
    said = f"video {str(photo)!r} is a photo: a still mouth has no sync to score."
    for extra in ([], ["--audio", str(tone_1s)]):
        assert main(["score", str(photo), "--backend", "dlib", *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}") and "max_lag" not in err and "--audio" not in err, err
    with pytest.raises(InputError, match="is a photo"):
        quality.sync_score(photo, tone_1s)


def test_score_of_an_audio_file_says_where_the_speech_goes(tone_1s, capsys):
    """``score speech.wav`` said "audio goes in the audio argument", a Python argument."""
    from nbhelpers.cli.main import main

    assert main(["score", str(tone_1s), "--backend", "dlib"]) == 2
    err = capsys.readouterr().err
    assert f"error: video {str(tone_1s)!r} is an audio file (container 'wav', no video stream). Give a video or " \
           "photo of a face; a speech file goes in as the audio." in err
    assert "argument" not in err


def test_verify_fixes_name_commands_not_other_ways(tmp_path, capsys):
    from nbhelpers.cli.main import main

    assert main(["verify", "--weights", str(tmp_path), "--sets", "s3fd"]) == 1
    out = capsys.readouterr().out
    assert "sha256 not computed (--deep computes it)" in out
    assert f"download it: `python -m nbhelpers download --weights {tmp_path}`\n" in out
    assert "deep=True" not in out and "Python" not in out
    assert_cli_words(out)


def test_python_calls_in_media_face_box_and_avatar_messages_leave_the_cli(tmp_path):
    """Each message as the package raises it: a Python call or argument a command-line user cannot type goes."""
    import wave

    import numpy as np

    from nbhelpers import media
    from nbhelpers.avatar.avatar import read_meta
    from nbhelpers.errors import CacheError
    from nbhelpers.quality import smooth_face_boxes

    with pytest.raises(InputError) as missing:
        media.load_audio(tmp_path / "nope.wav")
    assert cli_terms(str(missing.value)).endswith("Check the path (give the full path, or a path relative to the "
                                                  "current folder).")
    with wave.open(str(tmp_path / "silent.wav"), "wb") as w:  # a header and no samples
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(16000)
    with pytest.raises(InputError) as no_samples:
        media.load_audio(tmp_path / "silent.wav")
    assert cli_terms(str(no_samples.value)).endswith("(0 s of sound). Record or export the speech again.")
    with pytest.raises(CacheError) as no_avatar:
        read_meta(tmp_path)
    assert cli_terms(str(no_avatar.value)).endswith(f"`python -m nbhelpers avatar prepare VIDEO {tmp_path}`; a "
                                                    "damaged or outdated avatar is rebuilt by preparing it again.")
    boxes = np.full((40, 4), np.nan)
    with pytest.raises(InputError) as none:
        smooth_face_boxes(boxes)
    assert cli_terms(str(none.value)).endswith("SyncNet needs the face in view.")
    boxes[[0, -1]] = (10, 10, 50, 50)
    with pytest.raises(InputError) as gap:
        smooth_face_boxes(boxes)
    assert cli_terms(str(gap.value)).endswith("Trim the clip to the part with the face.")
    for caught in (missing, no_samples, no_avatar, none, gap):
        assert "nbhelpers." not in cli_terms(str(caught.value)) and "boxes=" not in cli_terms(str(caught.value))


def test_an_empty_input_file_is_named_and_said_empty(tone_1s, grey_clip, tmp_path, capsys):
    """A 0-byte file's message began "path: '...' is empty", the name of a Python argument."""
    from nbhelpers.cli.main import main

    empty = tmp_path / "clip.mp4"
    empty.write_bytes(b"")
    said = "is empty (0 bytes): its upload, export or download did not finish. Upload, export or download it again.\n"
    assert main(["lipsync", str(empty), str(tone_1s), "--weights", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"error: media file {str(empty)!r} {said}"
    assert main(["score", str(grey_clip), "--audio", str(empty), "--backend", "dlib"]) == 2
    assert capsys.readouterr().err == f"error: media file {str(empty)!r} {said}"  # score checks as lipsync does


def test_the_no_face_hint_gives_the_flag_alone():
    pytest.importorskip("dlib")
    import numpy as np

    from nbhelpers import faces
    from nbhelpers.errors import NoFaceError

    with pytest.raises(NoFaceError) as caught:
        faces.track(np.full((2, 64, 64, 3), 128, np.uint8), backend="dlib")
    assert cli_terms(str(caught.value)).endswith("try another backend, or give the crop box yourself: "
                                                 "--box=x1,y1,x2,y2.")


def test_an_estimated_size_reads_without_nested_brackets(tmp_path):
    from nbhelpers.weights.downloads import DownloadRow, _failure_message
    from nbhelpers.weights.manifest import MANIFEST

    entry = next(e for e in MANIFEST if e.size is None and e.approx_bytes)
    assert entry.expected_text().startswith("about ") and entry.expected_text().endswith(", estimated")
    row = DownloadRow(entry.name, entry.path, "failed", "", None, 0.0, "HTTP 503 from the host")
    line = _failure_message(tmp_path, [row], MANIFEST).splitlines()[1]
    assert line == f"  {entry.path} ({entry.expected_text()}):" and "))" not in line and "~" not in line


@pytest.mark.parametrize("command", [
    ["lipsync", "missing-video.mp4", "missing-audio.wav"],
    ["demo", "--tiny"],
    ["avatar", "generate", "no-avatar-here", "missing-audio.wav"],
])
def test_restore_strength_without_restore_is_refused_before_any_work(command, capsys, monkeypatch):
    # alone it was dropped without a word: the config uses it only with a restorer, and no avatar or jobs row names
    # one; refused first, so neither the missing files nor the demo's tiny weights are reached
    import nbhelpers.cli.main as cli_main
    import nbhelpers.testing

    def no_work(*args, **kwargs):
        raise AssertionError("work started before the flags were checked")

    monkeypatch.setattr(nbhelpers.testing, "make_tiny_weights", no_work)
    monkeypatch.setattr("nbhelpers.pipeline.lipsync", no_work)
    assert cli_main.main([*command, "--restore-strength", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --restore-strength 0.5 blends the restored face into the generated one, but no "
                          "face restorer is chosen: add --restore NAME (gfpgan, restoreformer, codeformer)")
    assert_cli_words(err)


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "2", "x"])
def test_a_restore_strength_out_of_its_rule_is_refused_for_that_before_the_missing_restorer(value, capsys):
    from nbhelpers.cli.main import main

    assert main(["lipsync", "missing-video.mp4", "missing-audio.wav", "--restore-strength", value]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --restore-strength must be a finite number from 0 to 1; got ") and value in err
    assert "restorer" not in err


def test_report_prints_the_cpu_warning_once(capsys, monkeypatch):
    from nbhelpers.cli.main import main

    monkeypatch.setattr(gpu, "report", lambda *a, **k: CPU_ONLY)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["report"]) == 0
    out, err = capsys.readouterr()
    shown = out + err + "".join(str(w.message) for w in caught)
    assert shown.count("Running on the CPU") == 1, shown


@pytest.mark.parametrize(("rep", "rate", "said"), [
    ("cpu", None, "compile (auto, the default): off: the models run on cpu; compiling pays only on a CUDA GPU."),
    ("t4", 57.4, "compile (auto, the default): on: this GPU makes 57 TFLOP/s in fp16: the GPU limits jobs, compiled "
                 "models pay."),
    ("t4", 750.0, "compile (auto, the default): off: --compile auto and this GPU makes 750 TFLOP/s in fp16: the CPU "
                  "side limits jobs here, so compiling would not pay (--compile on compiles anyway).")])
def test_report_says_whether_the_default_compiles_here(rep, rate, said, capsys, monkeypatch):
    """A new user could not find out whether compile was on: neither the report nor a clip's summary said."""
    from nbhelpers.cli.main import main
    from nbhelpers.gpu import compile as gc

    monkeypatch.setattr(gpu, "report", lambda *a, **k: CPU_ONLY if rep == "cpu" else T4)
    monkeypatch.setattr(gc, "can_compile", lambda device: (True, "") if str(device).startswith("cuda") else
                        (False, f"the models run on {device}; compiling pays only on a CUDA GPU"))
    monkeypatch.setattr(gc, "fp16_tflops", lambda device: rate)
    assert main(["report"]) == 0
    assert said in capsys.readouterr().out.splitlines()


def test_report_plans_with_the_tiny_models_of_a_tiny_weights_folder(tiny_weights, capsys, monkeypatch):
    from nbhelpers.cli.main import main

    monkeypatch.setattr(gpu, "report", lambda *a, **k: CPU_ONLY)
    monkeypatch.setenv("NBHELPERS_WEIGHTS", str(tiny_weights))
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert f"{tiny_weights} holds tiny random test weights: the plan is for the tiny models." in out
    assert "lipsync (tiny weights)" in out and "full weights" not in out
    assert main(["report", "--weights", str(tiny_weights.parent)]) == 0
    assert "lipsync (full weights)" in capsys.readouterr().out


def test_report_labels_the_full_and_the_tiny_time_per_frame(tiny_weights, capsys, monkeypatch):
    """The GPU report's verdict times the full-size models, the plan's the tiny ones: each line says which."""
    import dataclasses

    from nbhelpers.cli.main import main

    full = "CPU only: fp32, batch 4, about 39.2 s per 1920x1080 frame with face tracking by dwpose (auto)"
    monkeypatch.setattr(gpu, "report", lambda *a, **k: dataclasses.replace(CPU_ONLY, verdict=full))
    assert main(["report", "--weights", str(tiny_weights)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("verdict")]
    assert len(lines) == 2, lines
    assert lines[0].endswith(f"{full} [a lip-sync job with the full-size models]")
    assert lines[1].endswith("by dwpose (auto) [the tiny test models, not a real job]")
    assert main(["report", "--weights", str(tiny_weights.parent)]) == 0
    assert "[" not in capsys.readouterr().out  # full weights: both verdicts are the same job's


@pytest.mark.notorch
def test_report_says_what_its_cpu_time_per_frame_assumes_and_agrees_with_a_job_estimate(tmp_path, capsys,
                                                                                        monkeypatch):
    """The report's seconds per frame are a lip-sync job's (gpu.cpu_frame_seconds) at the size and backend it names."""
    from nbhelpers.cli.main import main

    monkeypatch.setattr(gpu, "report", lambda *a, **k: CPU_ONLY)
    assert main(["report", "--weights", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    per = gpu.cpu_frame_seconds("lipsync", "full", "auto", (1080, 1920))
    assert out.count(f"about {per:.1f} s per 1920x1080 frame with face tracking by dwpose (auto)") == 1, out
    assert "--backend dlib (dlib's landmarks, not DWPose's) about " in out and "landmark_backend" not in out
    with pytest.warns(PlanWarning) as caught:  # a 576x768 job with the tiny models: its figure, its size
        job = gpu.plan("lipsync", report=CPU_ONLY, n_frames=188, frame_size=(768, 576), weights="tiny")
    small = gpu.cpu_frame_seconds("lipsync", "tiny", "auto", (768, 576))
    assert f"about {small:.1f} s per 576x768 frame" in job.verdict and "576x768 frames" in str(caught[0].message)


@pytest.mark.notorch
def test_report_refuses_a_weights_folder_that_is_not_there(tmp_path, capsys, monkeypatch):
    """``report --weights /nonexistent`` printed a report and exited 0: a typo in the folder went unnoticed."""
    from nbhelpers.cli.main import main

    monkeypatch.setattr(gpu, "report", lambda *a, **k: pytest.fail("the report was made before --weights was read"))
    assert main(["report", "--weights", str(tmp_path / "nope")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"error: the weights folder '{tmp_path / 'nope'}' does not exist.") and not out


def test_restore_strength_with_restore_and_the_default_without_either():
    from nbhelpers.cli.flags import inference_config as _config
    from nbhelpers.cli.parser import build_parser

    parse = build_parser().parse_args
    cfg = _config(parse(["lipsync", "v.mp4", "a.wav", "--restore", "gfpgan", "--restore-strength", "0.25"]))
    assert (cfg.restore, cfg.restore_strength) == ("gfpgan", 0.25)
    assert (_config(parse(["lipsync", "v.mp4", "a.wav"])).restore_strength,
            _config(parse(["lipsync", "v.mp4", "a.wav", "--restore", "gfpgan"])).restore_strength) == (1.0, 1.0)


def test_outputs_of_tiny_weights_from_weights_get_the_noise_notice(tiny_weights, tmp_path, monkeypatch):
    """A new user's batch with ``--weights <tiny>`` printed no word that its mouths are noise (only demo --tiny
    did); lipsync and batch now name the folder of tiny random weights. Real weights get no notice."""
    from nbhelpers.cli.lipsync import tiny_note as _tiny_note

    note = _tiny_note(str(tiny_weights))
    assert note.startswith(f"NOTE: {tiny_weights} holds tiny RANDOM test weights") and "noise" in note
    assert _tiny_note(str(tmp_path)) == ""
    assert "leave --weights out" in note
    monkeypatch.setenv("NBHELPERS_WEIGHTS", str(tiny_weights))  # no --weights: the default folder is read
    from_env = _tiny_note(None)
    assert from_env.startswith(f"NOTE: {tiny_weights} holds tiny RANDOM test weights")
    # the download's default folder is the tiny one too: the fix names the variable, not --weights
    assert "set NBHELPERS_WEIGHTS to it (it names the tiny folder now)" in from_env
    assert "leave --weights out" not in from_env
    # --weights names the tiny folder too: leaving it out would fall back on the variable, so the same fix
    assert _tiny_note(str(tiny_weights)) == from_env


@pytest.mark.parametrize("argv", [["--bbox-shift", "-abc"], ["--bbox-shift"]])
def test_a_setting_flag_without_its_value_says_the_rule_and_how_to_write_a_negative_one(argv, capsys):
    """argparse takes '-abc' for an option: the error says what the setting is and how to write a negative value."""
    from nbhelpers.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(["lipsync", "v.mp4", "a.wav", *argv])
    err = capsys.readouterr().err.splitlines()[0]
    assert stop.value.code == 2 and err.startswith("python -m nbhelpers lipsync: error: --bbox-shift needs a value: "
                                                   "a whole number of pixels from -200 to 200 (pixels added to "
                                                   "landmark 29's y: ")
    assert err.endswith("A value after a space that starts with '-' and is not a number is read as another "
                        "option; write it after '=', as in --bbox-shift=-10.")
    from nbhelpers.cli.flags import inference_config
    from nbhelpers.cli.parser import build_parser

    assert inference_config(build_parser().parse_args(["lipsync", "v.mp4", "a.wav", "--bbox-shift", "-7"])
                            ).bbox_shift == -7  # a negative number after a space is a value, as the message says
    with pytest.raises(SystemExit):
        main(["lipsync", "v.mp4", "a.wav", "--batch-size"])
    err = capsys.readouterr().err.splitlines()[0]
    assert "error: --batch-size needs a value: a whole number of frames >= 1 or auto (automatic, the default) (" in err
    assert "after '='" not in err  # no negative value to write


def test_an_inverted_box_is_refused_when_the_flag_is_read():
    """--box=10,10,5,5 went on to fail as "does not fit the frame" after Ray had started; it is refused at once,
    saying which corner is which."""
    from nbhelpers.cli.flags import box_flag

    assert box_flag("190,160,360,330") == (190, 160, 360, 330) and box_flag(None) is None
    with pytest.raises(InputError, match=r"--box=10,10,5,5 is inverted: x1,y1 is the top-left corner"):
        box_flag("10,10,5,5")


@pytest.mark.parametrize("text", ["(190,160,360,330)", "[190, 160, 360, 330]", " (190, 160, 360, 330) "])
def test_a_box_written_as_python_writes_it_is_read(text):
    """``--box=(190,160,360,330)``, a box as Python prints it, is read as the four numbers."""
    from nbhelpers.cli.flags import box_flag

    assert box_flag(text) == (190, 160, 360, 330)


def test_demo_refuses_a_bad_box_before_making_weights(capsys, monkeypatch):
    """demo --tiny made its random weights (about 10 s) before reading --box."""
    from nbhelpers import testing
    from nbhelpers.cli.main import main

    monkeypatch.setattr(testing, "make_tiny_weights", lambda *a: pytest.fail("weights made before --box was read"))
    assert main(["demo", "--tiny", "--box=1,2,3"]) == 2
    out, err = capsys.readouterr()
    assert err == "error: --box must be four finite numbers x1,y1,x2,y2 in source pixels; got '1,2,3'.\n" and not out


def test_demo_refuses_a_box_off_the_photo_before_making_weights(capsys, monkeypatch):
    """demo --tiny made its random weights before finding that --box does not fit the bundled photo."""
    from nbhelpers import testing
    from nbhelpers.cli.main import main

    monkeypatch.setattr(testing, "make_tiny_weights", lambda *a: pytest.fail("weights made before --box was checked"))
    assert main(["demo", "--tiny", "--box=0,0,5000,5000"]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("error: --box=0,0,5000,5000 does not fit the frame") and not out, err


@pytest.mark.parametrize(("box", "said"), [
    ("0,0,500,500", "--box=0,0,500,500 does not fit the frame: the rule is 0 <= x1 < x2 <= 128 and 0 <= y1 < y2"),
    ("-4,0,60,60", "--box=-4,0,60,60 does not fit the frame"),
    ("0,0,5,5", "--box=0,0,5,5 is 5x5 pixels; each side must be at least 16 pixels. Draw it as wide as the face, "
                "its bottom at the chin and its middle at the nose")])
def test_a_box_the_frame_refuses_is_named_as_the_flag(box, said, tiny_weights, grey_clip, tone_1s, tmp_path, capsys):
    """The frame's check words the box as the Python argument ``boxes = (0, 0, 500, 500)``; a command-line user typed
    --box, and the Python API keeps its own words."""
    from nbhelpers.cli.main import main
    from nbhelpers.faces.boxes import user_boxes

    assert main(["lipsync", str(grey_clip), str(tone_1s), "-o", str(tmp_path / "o.mp4"), "--weights",
                 str(tiny_weights), "--device", "cpu", f"--box={box}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {said}") and "boxes" not in err, err
    with pytest.raises(InputError, match=r"^boxes = \("):
        user_boxes(tuple(int(v) for v in box.split(",")), 1, (128, 128))


def test_a_batch_setting_out_of_range_names_its_line_and_setting_not_a_flag(tiny_weights, tmp_path):
    """extra_margin 500 in a jobs file's row: the message names the file's line, the job and the setting (the
    trial's batch said `job 'o2': --extra-margin must be ...`, a flag the user never typed), before Ray starts;
    the same value as a flag is still named as the flag."""
    (tmp_path / "jobs.csv").write_text("# two jobs\nvideo,audio,output,extra_margin\na.mp4,1.wav,o1.mp4,12\n"
                                       "a.mp4,2.wav,o2.mp4,500\n")
    proc = cli("batch", tmp_path / "jobs.csv", "--weights", tiny_weights, "--device", "cpu")
    assert proc.returncode == 2, proc.stderr
    assert ("jobs.csv line 4 (job 'o2'), setting extra_margin: must be a whole number of pixels from 0 to 200; got 500."
            in proc.stderr), proc.stderr
    assert "--extra-margin" not in proc.stderr and "Traceback" not in proc.stderr
    assert_cli_words(proc.stderr)
    flag = cli("batch", tmp_path / "jobs.csv", "--weights", tiny_weights, "--device", "cpu", "--bbox-shift", "999")
    assert flag.returncode == 2
    assert "--bbox-shift must be a whole number of pixels from -200 to 200; got 999" in flag.stderr


def test_score_offers_the_backends_it_runs_and_says_what_each_does():
    """score's --backend listed no dwpose and offered 'boxes' (crop boxes score cannot be given); its choices and
    their help come from the landmark_backend field, less 'boxes'."""
    proc = cli("score", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "--backend {auto,dwpose,dwpose-onnx,mmpose,dlib}" in text and "dwpose (DWPose in torch)" in text
    assert "boxes" not in text
    refused = cli("score", "v.mp4", "--backend", "boxes")
    assert refused.returncode == 2 and "invalid choice: 'boxes'" in refused.stderr
    lipsync = " ".join(cli("lipsync", "--help").stdout.split())  # where --box gives the boxes, it is offered
    assert "dlib,boxes}" in lipsync and "boxes (the crop boxes given: no detection)" in lipsync


@pytest.mark.parametrize(("argv", "said"), [
    (["lipsync", "v.mp4", "a.wav", "--bbox-shfit", "5"], "python -m nbhelpers lipsync: error: unrecognized arguments: "
     "--bbox-shfit 5. Did you mean --bbox-shift?"),
    (["avatar", "generate", "d", "a.wav", "--encodr=nvenc"], "python -m nbhelpers avatar generate: error: "
     "unrecognized arguments: --encodr=nvenc. Did you mean --encoder?"),
    (["score", "v.mp4", "--zzz"], "python -m nbhelpers score: error: unrecognized arguments: --zzz.")])
def test_an_unknown_flag_is_refused_by_its_command_naming_the_nearest_flag(argv, said, capsys):
    """argparse's own error came from the top parser, with its usage line and no hint."""
    from nbhelpers.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    prog = said.split(": error:")[0]
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines() == [said, f"run '{prog} --help' for its usage and options"]


@pytest.mark.parametrize(("argv", "said"), [
    (["lipsync", "v.mp4"], "python -m nbhelpers lipsync: error: the following arguments are required: audio"),
    (["lipsync", "v.mp4", "a.wav", "--backend", "foo"], "python -m nbhelpers lipsync: error: argument --backend: "
     "invalid choice: 'foo' (choose from 'auto', 'dwpose', 'dwpose-onnx', 'mmpose', 'dlib', 'boxes')"),
    (["avatar"], "python -m nbhelpers avatar: error: a command is required: prepare, generate, live"),
    (["lipsinc"], "python -m nbhelpers: error: unknown command 'lipsinc' (choose from 'lipsync', "
     "'demo', 'download', 'verify', 'report', 'score', 'batch', 'avatar')")])
def test_a_usage_error_is_its_line_and_the_help_to_run_without_the_usage_block(argv, said, capsys):
    """argparse printed the command's usage (18 lines for lipsync) above the error, burying the line that matters."""
    from nbhelpers.cli.main import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    prog = said.split(": error:")[0]
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and not out
    assert err.splitlines() == [said, f"run '{prog} --help' for its usage and options"]


def test_no_usable_landmark_backend_points_to_the_download_command_and_box(tmp_path, monkeypatch):
    """The auto backend's last resort fails: its install lines name the CLI's download command and --box, not the
    notebook, nbhelpers.weights or nbhelpers.faces.track."""
    from nbhelpers.errors import MissingDependencyError
    from nbhelpers.faces import registry

    def no_dlib(**kwargs):
        raise MissingDependencyError("dlib is not installed")

    monkeypatch.setitem(registry.BACKENDS.data, "dlib", no_dlib)  # .data: restored as the lazy string
    with pytest.raises(MissingDependencyError, match="no landmark backend is usable") as caught:
        registry.get_backend("auto", weights_dir=tmp_path)  # an empty folder: no backend has its weights
    text = cli_terms(str(caught.value))
    assert "then download the weights: python -m nbhelpers download)" in text
    assert text.endswith("or give the crop box yourself: --box=x1,y1,x2,y2 (lipsync, demo, batch, avatar prepare).")
    assert_cli_words(text)
    assert "nbhelpers." not in text, text


def test_the_seed_help_states_the_range_that_the_check_enforces(capsys):
    """--seed refuses negative numbers (see above), so its help gives that range instead of a signed integer."""
    from nbhelpers.cli.main import main

    with pytest.raises(SystemExit):
        main(["lipsync", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    start = text.index("--seed N seed")
    seed = text[start:text.index("--latent-mode {", start)]
    assert "from 0 to 2**63 - 1" in seed and "signed" not in seed


def test_score_of_a_video_without_sound_asks_for_audio(grey_clip, capsys):
    """Without --audio, score reads VIDEO's sound; a silent video was told to give "a video that has sound"."""
    from nbhelpers.cli.main import main

    assert main(["score", str(grey_clip), "--backend", "dlib"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: audio: ") and err.endswith("Give the speech with --audio FILE.\n")
    assert err.count("\n") == 1 and "a video that has sound" not in err


def test_a_weights_error_on_the_tiny_weights_does_not_offer_the_tiny_weights(tmp_path, monkeypatch, capsys):
    """The hint to try ``demo --tiny`` follows a weights error, except where the folder in use holds the tiny test
    weights already (a restorer's weights missing from it, say)."""
    import nbhelpers.cli.main as cli_main
    from nbhelpers.errors import WeightsError
    from nbhelpers.weights.manifest import TINY_MARKER

    def missing(args):
        raise WeightsError("the GFPGAN weights are missing")

    monkeypatch.setitem(cli_main.COMMANDS, "verify", missing)
    tiny, real = tmp_path / "tiny", tmp_path / "real"
    tiny.mkdir()
    real.mkdir()
    (tiny / TINY_MARKER).write_text("{}")
    for folder, hinted in ((tiny, False), (real, True)):
        assert cli_main.main(["verify", "--weights", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: the GFPGAN weights are missing") and ("demo --tiny" in err) is hinted, err


@pytest.mark.parametrize("argv, names", [([], "lipsync, demo, download, verify, report, score, batch, avatar"),
                                         (["avatar"], "prepare, generate, live")])
def test_a_missing_command_is_named_by_its_choices(argv, names, capsys):
    """argparse names a missing subcommand by its dest ('command', 'avatar_cmd'), a word no user typed."""
    from nbhelpers.cli.main import main

    with pytest.raises(SystemExit) as caught:
        main(argv)
    err = capsys.readouterr().err
    assert caught.value.code == 2
    assert f"error: a command is required: {names}\n" in err
    assert "avatar_cmd" not in err and "required: command" not in err
