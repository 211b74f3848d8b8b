"""Batch dubbing on Ray: jobs files, failures recorded, a killed worker's job made once, finished outputs skipped.

The Ray tests share one local Ray (2 CPUs) for the module and tiny weights; clips are 8 frames of the real face
video and audios of 0.32-0.4 s, so each job makes 8-10 frames.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT, decode_frames, loaded_by

BOX = (190, 160, 360, 330)  # crop box around the face of the shared 576x768 video


# ------------------------------------------------------------------------------------------------------------------
# Jobs files and the light module (no Ray needed)


@pytest.mark.notorch
def test_import_is_light():
    assert loaded_by("import nbhelpers, nbhelpers.batch", ("ray", "torch")) == []


@pytest.mark.notorch
def test_jobs_per_worker_are_chosen_from_free_memory():
    """Two jobs at once per worker only where the free memory of the fullest GPU holds every worker's peak with
    two jobs (worker_gib) within the planner's safety margin; one on the CPU, when the memory cannot be read, or on
    a cluster (its GPUs are not visible from here). A worker's peak grows with its jobs and at fp32."""
    from nbhelpers import InferenceConfig
    from nbhelpers.batch.worker import choose_jobs_per_worker, worker_gib
    from nbhelpers.gpu.model import MEMORY_MODEL

    fp16 = InferenceConfig()
    assert worker_gib(fp16) == worker_gib(fp16, jobs=1) < worker_gib(fp16, jobs=2)
    assert worker_gib(fp16) < worker_gib(InferenceConfig(fp16=False))
    for per_gpu in (1, 2):
        need = per_gpu * worker_gib(fp16, jobs=2)
        enough = need / (1.0 - MEMORY_MODEL.safety_fraction)
        n, why = choose_jobs_per_worker(fp16, {0: enough + 0.1}, per_gpu, joining=False)
        assert n == 2 and f"{need:.1f} GiB" in why
        assert choose_jobs_per_worker(fp16, {0: enough - 0.1}, per_gpu, joining=False)[0] == 1
        assert choose_jobs_per_worker(fp16, {0: enough + 99, 1: enough - 0.1}, per_gpu, joining=False)[0] == 1
    assert choose_jobs_per_worker(fp16, {0: 139.8}, 1, joining=False)[0] == 2  # an H200
    assert choose_jobs_per_worker(InferenceConfig(device="cpu"), {0: 139.8}, 1, joining=False) == (1, "")
    n, why = choose_jobs_per_worker(fp16, None, 1, joining=False)
    assert n == 1 and "--jobs-per-worker 2" in why
    assert choose_jobs_per_worker(fp16, {0: 139.8}, 1, joining=True)[0] == 1


@pytest.mark.notorch
def test_the_summary_line_says_how_many_workers_share_a_gpu(tmp_path):
    from nbhelpers.batch import BatchResult, JobOutcome

    done = JobOutcome("a", "done", 250, 2.0, "", tmp_path / "a.mp4", tmp_path / "a.wav", tmp_path / "o.mp4")
    note = "2 workers per GPU: 140.0 GiB free on the fullest GPU holds two workers' 13.8 GiB peaks"
    line = BatchResult((done,), None, 10.0, workers=("h/1 cuda", "h/2 cuda"), workers_note=note).summary()
    assert line.endswith(f"on 2 GPU workers ({note})")
    cpu = BatchResult((done,), None, 10.0, workers=("h/1 cpu",), workers_note="").summary()
    assert cpu.endswith("on 1 CPU worker") and cpu.startswith("1 job: 1 done, ")
    assert note not in BatchResult((done,), None, 10.0, workers=(), workers_note=note).summary()


@pytest.mark.notorch
def test_batch_settings_are_checked_when_made_and_the_batch_flags_come_from_them():
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run
    from nbhelpers.cli.flags import config_from
    from nbhelpers.cli.parser import build_parser
    from nbhelpers.cli.terms import cli_terms
    from nbhelpers.errors import InputError

    for name, value, rule in [("cpu_workers", 0, "a whole number >= 1"), ("max_attempts", True, "a whole number "
                              ">= 1"), ("jobs_per_worker", 1.5, "a whole number >= 1"),
                              ("workers_per_gpu", 0, "a whole number >= 1"),
                              ("gpus", -1, "a whole number >= 0 or None")]:
        with pytest.raises(InputError, match=rf"^{name} must be {rule}.*; got {value!r}\.$") as caught:
            BatchConfig(**{name: value})
        assert cli_terms(str(caught.value)).startswith(f"--{name.replace('_', '-')} must be ")
    assert BatchConfig(gpus=0, workers_per_gpu=None, jobs_per_worker=2).jobs_per_worker == 2

    def flags(*extra):
        return config_from(build_parser().parse_args(["batch", "jobs.csv", *extra]), BatchConfig)

    assert flags() == BatchConfig()
    assert flags("--address", "auto", "--cache-dir", "c", "--summary", "s.csv", "--cpu-workers", "2",
                 "--workers-per-gpu", "3", "--jobs-per-worker", "1", "--gpus", "0", "--max-attempts", "5",
                 "--rerun") == BatchConfig(address="auto", cache_dir="c", summary="s.csv", cpu_workers=2,
                                           workers_per_gpu=3, jobs_per_worker=1, gpus=0, max_attempts=5, rerun=True)
    with pytest.raises(InputError, match="config must be a BatchConfig .* as inference="):
        run([], InferenceConfig())  # the jobs' settings given where the batch's go


@pytest.mark.notorch
def test_read_jobs_csv_and_jsonl(tmp_path):
    from nbhelpers.batch import read_jobs

    (tmp_path / "jobs.csv").write_text("video,audio,output,bbox_shift,box\n"
                                       "faces/a.mp4,speech/1.wav,out/a1.mp4,,\n"
                                       "# a comment\n"
                                       "faces/a.mp4,/abs/2.wav,out/a2.mp4,-5,\"190,160,360,330\"\n")
    jobs = read_jobs(tmp_path / "jobs.csv")
    assert [j.name for j in jobs] == ["a1", "a2"]
    assert jobs[0].video == tmp_path / "faces" / "a.mp4" and jobs[0].settings == {}
    assert str(jobs[1].audio) == "/abs/2.wav"
    assert jobs[1].settings == {"bbox_shift": -5, "box": BOX}
    (tmp_path / "jobs.jsonl").write_text(
        json.dumps({"video": "a.mp4", "audio": "1.wav", "name": "first", "settings": {"extra_margin": 12}}) + "\n\n"
        + json.dumps({"video": "b.mp4", "audio": "2.wav", "output": "o/b.mp4", "blur_ratio": 0.1}) + "\n")
    jobs = read_jobs(tmp_path / "jobs.jsonl")
    assert jobs[0].name == "first" and jobs[0].output == tmp_path / "results" / "a_1.mp4"
    assert jobs[0].settings == {"extra_margin": 12} and jobs[1].settings == {"blur_ratio": 0.1}
    (tmp_path / "clips").mkdir()  # an existing folder takes the default name, as -o DIR does
    (tmp_path / "jobs2.csv").write_text("video,audio,output\nfaces/a.mp4,speech/1.wav,clips\n")
    [job] = read_jobs(tmp_path / "jobs2.csv")
    assert job.output == tmp_path / "clips" / "a_1.mp4" and job.name == "a_1"


def test_a_half_built_avatar_of_a_stopped_batch_is_removed_by_the_next(tmp_path, lavfi_video, lavfi_tone,
                                                                       tiny_weights, monkeypatch):
    """A batch stopped mid-preparation left ``<face>/.building-*/frames.mkv`` (121 MB in a new user's try) in the
    avatar cache for good. The next batch on that cache removes it (it holds the cache's lock, so nobody is building
    there) and keeps the avatars that were finished."""
    pytest.importorskip("ray")
    from nbhelpers import batch
    from nbhelpers.config import BatchConfig

    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: False)
    cache = tmp_path / "cache"
    half = cache / "face-1234" / ".building-x1"
    half.mkdir(parents=True)
    (half / "frames.mkv").write_bytes(b"0" * 1000)
    (cache / "face-1234" / "manifest.json").write_text("{}")  # a finished avatar's file stays
    video, blip = lavfi_video("testsrc", "64x48", frames=4), lavfi_tone(0.02, 300)  # fails at the checks
    jobs = [{"video": str(video), "audio": str(blip), "output": str(tmp_path / "o" / "a.mp4")}]
    (outcome,) = batch.run(jobs, BatchConfig(cache_dir=cache), weights_dir=tiny_weights).outcomes
    assert outcome.status == "failed"
    assert not half.exists() and (cache / "face-1234" / "manifest.json").exists()


@pytest.mark.notorch
@pytest.mark.parametrize("text, message", [
    ("video,audio,output\na.mp4,1.wav,o.mp4\nb.mp4,2.wav,o.mp4\n", "jobs.csv line 2 and jobs.csv line 3 both write"),
    ("video,audio,output\na.mp4,1.wav,a.mp4\n", "a.mp4', which is its own video: writing it would replace"),
    ("video,audio,output\na.mp4,1.wav,o.mp4\no.mp4,2.wav,p.mp4\n", "o.mp4', which is jobs.csv line 3's video"),
    ("video,audio,output,colour\na.mp4,1.wav,o.mp4,red\n", "unknown column(s) colour"),
    ("video,audio,output\na.mp4,,o.mp4\n", "audio missing"),
    ("video,audio,output\na.mp4,1.wav,o.mov\n", "output must end in .mp4"),
    ("video,audio,output,bbox_shift\na.mp4,1.wav,o.mp4,up\n", "setting bbox_shift: must be a whole number; got 'up'"),
    ("video,audio,output,extra_margin\na.mp4,1.wav,o.mp4,2.5\n",
     "setting extra_margin: must be a whole number; got '2.5'"),
    ("video,audio,output,blur_ratio\na.mp4,1.wav,o.mp4,nan\n", "setting blur_ratio: must be a number; got 'nan'"),
    ("video,audio,output,box\na.mp4,1.wav,o.mp4,\"1,2,3\"\n", "box must be four finite numbers"),
    ("video,audio,output,box\na.mp4,1.wav,o.mp4,\"inf,2,3,4\"\n", "box must be four finite numbers"),
    ("video,audio,output,box\na.mp4,1.wav,o.mp4,\"1e999,2,3,4\"\n", "box must be four finite numbers"),
    ("video,audio,output\n", "holds no job"),
    # a comment and an empty line before the bad row: the message names the line an editor shows (line 5)
    ("# the jobs\nvideo,audio,output\n\na.mp4,1.wav,o.mp4\nb.mp4,,p.mp4\n", "jobs.csv line 5: audio missing"),
    ("video,audio,output,\na.mp4,1.wav,o.mp4,\n", "has an empty column name (a comma at the end"),
    ("video;audio;output\na.mp4;1.wav;o.mp4\n", "is separated by semicolons; a jobs CSV separates its columns by "
                                                  "commas"),
    ("video\taudio\toutput\na.mp4\t1.wav\to.mp4\n", "is separated by tabs"),
    ("video,audio,output\na.mp4,1.wav,o.mp4,1,2,3,4\n", "line 2 has more cells than the header has columns (a box's"),
    # JSON lines: values of the wrong kind are refused, not converted or passed on to fail later
    ('{"video": "a.mp4", "audio": "1.wav", "box": 5}\n', "jobs.jsonl line 1: box must be four finite numbers"),
    ('{"video": "a.mp4", "audio": "1.wav", "box": "1,2,3,x"}\n', "box must be four finite numbers"),
    ('{"video": "a.mp4", "audio": "1.wav", "box": [1, 2, 3, true]}\n', "box must be four finite numbers"),
    ('{"video": "a.mp4", "audio": "1.wav", "settings": "bbox_shift=5"}\n', "settings must be an object of setting "
                                                                            "names and values"),
    ('{"video": "a.mp4", "audio": "1.wav", "settings": [5]}\n', "settings must be an object"),
    ('{"video": "a.mp4", "audio": "1.wav", "extra_margin": [1]}\n',
     "setting extra_margin: must be a whole number; got [1]"),
    ('{"video": "a.mp4", "audio": "1.wav", "extra_margin": 2.5}\n',
     "setting extra_margin: must be a whole number; got 2.5"),
    ('{"video": "a.mp4", "audio": "1.wav", "bbox_shift": true}\n',
     "setting bbox_shift: must be a whole number; got True"),
    ('{"video": "a.mp4", "audio": "1.wav", "bbox_shift": 1e400}\n',
     "setting bbox_shift: must be a whole number; got inf"),
    ('{"video": "a.mp4", "audio": "1.wav", "batch_size": 10000000000000000000000000000000000000000000000000000000'
     '00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
     '00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
     '00000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000'
     '0000}\n', "jobs.jsonl line 1, setting batch_size: must be a whole number"),
    ('{"video": "a.mp4", "audio": "1.wav", "parsing_mode": 3}\n', "setting parsing_mode: must be text; got 3"),
    ('{"video": 5, "audio": "1.wav"}\n', "jobs.jsonl line 1: video must be a path as text; got 5"),
    ("video,audio,output,box\na.mp4,1.wav,o.mp4,\"360,330,190,160\"\n", "box '360,330,190,160' is inverted"),
    ("video,audio,output,output\na.mp4,1.wav,o.mp4,p.mp4\n", "the header names output more than once"),
    ("video,audio,output,face\na.mp4,1.wav,o.mp4,\"1,2@x\"\n", "jobs.csv line 2, setting face: must be"),
    ("vid,aud\na.mp4,1.wav\n", "jobs.csv: the first line 'vid,aud' names none of a job's columns, so it is not a "
                               "header; a jobs CSV starts with a header line"),
    ("Video,output\na.mp4,o.mp4\n", "the header 'Video,output' has no audio column; the first line"),
    ("video,aud\na.mp4,1.wav\n", "the header 'video,aud' has no audio column"),
    ("a.mp4,1.wav,o.mp4\nb.mp4,2.wav,p.mp4\n", "the first line 'a.mp4,1.wav,o.mp4' names none of a job's columns"),
    ("", "holds no job"),
    ("# only a comment\n\n", "holds no job"),
])
def test_bad_jobs_files_say_what_is_wrong(tmp_path, text, message):
    from nbhelpers.batch import read_jobs
    from nbhelpers.errors import InputError

    name = "jobs.jsonl" if text.startswith("{") else "jobs.csv"
    (tmp_path / name).write_text(text)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        read_jobs(tmp_path / name)


@pytest.mark.notorch
@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_every_bad_row_of_a_jobs_file_is_named_at_once(tmp_path, suffix):
    """A new user's file with three bad rows took three runs: read_jobs stopped at the first. The good rows in
    between are not named; past ten, the rest are counted."""
    from nbhelpers.batch import read_jobs
    from nbhelpers.errors import InputError

    rows = [("a.mp4", "1.wav", "5"), ("b.mp4", "", "5"), ("c.mp4", "3.wav", "up"), ("d.mp4", "4.wav", "7"),
            ("e.mp4", "5.wav", "2.5")]
    if suffix == ".csv":
        text = "video,audio,bbox_shift\n" + "".join(f"{v},{a},{b}\n" for v, a, b in rows)
        first = 2
    else:
        text = "".join(json.dumps({"video": v, "audio": a, "bbox_shift": b}) + "\n" for v, a, b in rows)
        first = 1
    path = tmp_path / f"jobs{suffix}"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        read_jobs(path)
    lines = str(caught.value).splitlines()
    assert lines[0] == "3 rows of the jobs file are not valid jobs:", lines
    assert [ln.split(":")[0].split(",")[0] for ln in lines[1:]] == [f"- {path.name} line {first + k}"
                                                                    for k in (1, 2, 4)]
    assert "audio missing" in lines[1] and "got 'up'" in lines[2] and "got '2.5'" in lines[3]
    path.write_text("video,audio,bbox_shift\n" + "a.mp4,1.wav,x\n" * 12 if suffix == ".csv" else
                    (json.dumps({"video": "a.mp4", "audio": "1.wav", "bbox_shift": "x"}) + "\n") * 12)
    with pytest.raises(InputError, match=r"^12 rows .*\n(- .*\n){10}- and 2 more\.$"):
        read_jobs(path)


@pytest.mark.notorch
def test_a_jobs_file_not_in_utf8_is_refused_with_how_to_save_it(tmp_path):
    from nbhelpers.batch import read_jobs
    from nbhelpers.errors import InputError

    (tmp_path / "jobs.csv").write_bytes("video,audio,output\na.mp4,1.wav,o.mp4\n".encode("utf-16"))
    with pytest.raises(InputError, match=r"is not UTF-8 text .*save it as UTF-8"):
        read_jobs(tmp_path / "jobs.csv")
    (tmp_path / "jobs.csv").write_bytes("video,audio,output\nä.mp4,1.wav,o.mp4\n".encode("utf-8-sig"))  # a BOM is fine
    assert read_jobs(tmp_path / "jobs.csv")[0].video.name == "ä.mp4"


@pytest.mark.notorch
def test_paths_come_out_absolute_without_dot_dot(tmp_path, monkeypatch):
    from nbhelpers.batch import Job, check_jobs, read_jobs

    (tmp_path / "jobs").mkdir()
    (tmp_path / "elsewhere" / "deep").mkdir(parents=True)
    (tmp_path / "jobs" / "link").symlink_to(tmp_path / "elsewhere" / "deep")  # link/.. is elsewhere, as for the OS
    (tmp_path / "jobs" / "jobs.csv").write_text("video,audio,output\n"
                                                "../clips/a.mp4,./speech/../speech/1.wav,../out/a1.mp4\n"
                                                "link/../b.mp4,1.wav,\n")
    a, b = read_jobs(tmp_path / "jobs" / "jobs.csv")
    assert (a.video, a.audio, a.output) == (tmp_path / "clips" / "a.mp4", tmp_path / "jobs" / "speech" / "1.wav",
                                            tmp_path / "out" / "a1.mp4")
    assert b.video == tmp_path / "elsewhere" / "b.mp4" and b.output == tmp_path / "jobs" / "results" / "b_1.mp4"
    monkeypatch.chdir(tmp_path / "jobs")
    (c,) = check_jobs([Job("c", "../clips/c.mp4", "x/../1.wav", "../out/c.mp4")])
    assert (c.video, c.audio, c.output) == (tmp_path / "clips" / "c.mp4", tmp_path / "jobs" / "1.wav",
                                            tmp_path / "out" / "c.mp4")


@pytest.mark.notorch
def test_only_rays_token_auth_notice_is_filtered():
    import logging

    from nbhelpers.batch.cluster import _AUTH_NOTICE_LOGGER, _drop_auth_notice

    def record(message, level=logging.WARNING):
        return logging.LogRecord(_AUTH_NOTICE_LOGGER, level, __file__, 1, message, None, None)

    assert not _drop_auth_notice(record("Token authentication is enabled for this Ray cluster. Set "
                                        "RAY_AUTH_MODE=disabled to opt out. For more information, see "
                                        "https://docs.ray.io/en/latest/"))
    # Ray's security warning still shows
    assert _drop_auth_notice(record("Token authentication is disabled for this Ray cluster. Anyone with network "
                                    "access to the cluster can run arbitrary code"))
    assert _drop_auth_notice(record("Token authentication is enabled but no token was found", logging.ERROR))


def hint_jobs(lavfi_video, lavfi_tone, folder):
    """Two jobs that fail at the input checks: a missing video, and a corrupt audio beside a readable video."""
    video = lavfi_video("testsrc", "64x64", frames=4)
    audio = lavfi_tone(0.3, 300, 44100)
    corrupt = folder / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x01" * 400)
    return corrupt, [{"name": "gone", "video": str(folder / "gone.mp4"), "audio": str(audio),
                      "output": str(folder / "out" / "gone.mp4")},
                     {"name": "bad", "video": str(video), "audio": str(corrupt),
                      "output": str(folder / "out" / "bad.mp4")}]


def test_a_rerun_of_jobs_that_failed_at_the_input_checks_starts_no_ray(tmp_path, lavfi_video, lavfi_tone,
                                                                      tiny_weights, monkeypatch):
    pytest.importorskip("ray")
    from nbhelpers import batch

    starts = []
    # records each start; starts nothing
    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: starts.append(a) or False)
    corrupt, jobs = hint_jobs(lavfi_video, lavfi_tone, tmp_path)

    def run(**kw):
        starts.clear()
        result = batch.run(jobs, batch.BatchConfig(**kw), weights_dir=tiny_weights)
        assert [o.status for o in result.outcomes] == ["failed", "failed"] and result.workers == ()
        return result, len(starts)

    first, n = run()
    assert n == 1  # nothing known yet: Ray starts while the inputs are probed
    assert "gone.mp4" in first.outcomes[0].error and "corrupt.wav" in first.outcomes[1].error
    again, n = run()
    assert n == 0  # the same inputs fail again: no Ray
    hints = sorted((tmp_path / "out" / "avatar-cache" / "failed").iterdir())  # in the batch's state folder
    assert len(hints) == 2 and {json.loads(h.read_text())["stage"] for h in hints} == {"inputs"}
    first_lines = [o.error.splitlines()[0] for o in first.outcomes]  # (ffmpeg's own lines hold addresses)
    assert [o.error.splitlines()[0] for o in again.outcomes] == first_lines  # the probe's, as it is now
    assert run(rerun=True)[1] == 1
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + b"\x02" * 500)  # changed: the hint no longer matches
    assert run()[1] == 1
    assert run()[1] == 0


def test_a_box_outside_its_video_fails_at_the_checks_before_any_worker(tmp_path, lavfi_video, lavfi_tone,
                                                                          tiny_weights, monkeypatch):
    """A new user's box of 1,1,600,800 on a smaller video went to a worker (Ray started, every run); it is now an
    input-check failure, named, with no worker, and its rerun starts no Ray."""
    pytest.importorskip("ray")
    from nbhelpers import batch

    starts = []
    # records each start; starts nothing
    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: starts.append(a) or False)
    video, audio = lavfi_video("testsrc", "64x48", frames=4), lavfi_tone(0.3, 300, 44100)
    jobs = [{"name": "wide", "video": str(video), "audio": str(audio), "output": str(tmp_path / "o" / "wide.mp4"),
             "box": (1, 1, 60, 80)}]  # 80 rows in a 48-row frame
    result = batch.run(jobs, weights_dir=tiny_weights)
    (outcome,) = result.outcomes
    assert outcome.status == "failed" and result.workers == () and outcome.error.startswith("InputError")
    assert "does not fit" in outcome.error and "64x48" in outcome.error.replace(" ", "")
    starts.clear()
    assert batch.run(jobs, weights_dir=tiny_weights).outcomes[0].status == "failed" and starts == []


def test_a_face_past_the_video_fails_at_the_checks_naming_its_line(tmp_path, lavfi_video, lavfi_tone, tiny_weights,
                                                                   monkeypatch):
    """A face choice on frame 9 of a 4-frame video, or a point outside its frame, fails its job at the input checks
    (the single clip's check_face), naming the jobs file's line, before any worker starts."""
    pytest.importorskip("ray")
    from nbhelpers import batch

    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: False)  # starts nothing
    video, audio = lavfi_video("testsrc", "64x48", frames=4), lavfi_tone(0.3, 300, 44100)
    (tmp_path / "jobs.csv").write_text(f"video,audio,output,face\n{video},{audio},late.mp4,\"10,10@9\"\n"
                                       f"{video},{audio},wide.mp4,\"70,10\"\n")
    result = batch.run(tmp_path / "jobs.csv", weights_dir=tiny_weights)
    late, wide = result.outcomes
    assert late.status == wide.status == "failed" and result.workers == ()
    assert late.error.startswith("InputError: jobs.csv line 2: face='10,10@9' names frame 9, but the video has 4")
    assert wide.error.startswith("InputError: jobs.csv line 3: face='70,10' lies outside the frame")


def test_too_short_audio_and_a_missing_video_fail_at_the_checks_in_batch_terms(tmp_path, lavfi_video, lavfi_tone,
                                                                             tiny_weights, monkeypatch):
    """A new user's 0.02 s audio went to a worker (Ray started on every rerun only to fail there); it now fails at
    the checks. A missing video's advice is about the jobs file, not a notebook's upload cell; a box that does not
    fit is named as the job's setting, ``box``."""
    pytest.importorskip("ray")
    from nbhelpers import batch

    starts = []
    # records each start; starts nothing
    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: starts.append(a) or False)
    video, blip = lavfi_video("testsrc", "64x48", frames=4), lavfi_tone(0.02, 300)
    jobs = [{"name": "blip", "video": str(video), "audio": str(blip), "output": str(tmp_path / "o" / "blip.mp4")},
            {"name": "gone", "video": str(tmp_path / "gone.mp4"), "audio": str(blip),
             "output": str(tmp_path / "o" / "gone.mp4")},
            {"name": "wide", "video": str(video), "audio": str(blip), "output": str(tmp_path / "o" / "wide.mp4"),
             "box": (1, 1, 60, 80)}]
    short, gone, wide = batch.run(jobs, weights_dir=tiny_weights).outcomes
    assert short.status == "failed" and "lasts 0.020 s, shorter than one frame" in short.error
    assert "notebook" not in gone.error and "relative to its folder" in gone.error
    assert wide.error.startswith("InputError: job 3: box 1,1,60,80 does not fit the frame: the rule is 0 <= x1 < x2 "
                                 "<= 64"), wide.error
    starts.clear()
    assert [o.status for o in batch.run(jobs, weights_dir=tiny_weights).outcomes] == ["failed"] * 3
    assert starts == []  # the hints of all three match: no Ray on the rerun


@pytest.mark.notorch
def test_the_summary_and_cache_default_to_a_folder_of_the_outputs_never_the_root():
    from pathlib import Path

    from nbhelpers.batch import Job, outputs_folder

    def job(name, output):
        return Job(name, Path("/v.mp4"), Path("/a.wav"), Path(output))

    assert outputs_folder([job("a", "/tmp/nbh-x/a/1.mp4"), job("b", "/tmp/nbh-x/b/2.mp4")]) == Path("/tmp/nbh-x")
    # two trees sharing only "/" (a new user's /tmp/bt/cp and /var/tmp/btout): the first job's folder, not "/"
    assert outputs_folder([job("a", "/tmp/bt/cp/1.mp4"), job("b", "/var/tmp/btout/2.mp4")]) == Path("/tmp/bt/cp")


def test_a_batch_that_cannot_write_its_outputs_is_refused_before_ray(tmp_path, tiny_weights, monkeypatch):
    pytest.importorskip("ray")
    from nbhelpers import batch
    from nbhelpers.errors import InputError

    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: pytest.fail("Ray started"))
    (tmp_path / "a-file").write_text("x")
    jobs = [{"video": "v.mp4", "audio": "a.wav", "output": str(tmp_path / "a-file" / "o.mp4")}]
    with pytest.raises(InputError, match=r"cannot write in '[^']*/a-file' \(a file, not a folder\), "
                                         r"'[^']*/a-file/avatar-cache' \([^']*/a-file is a file, not a folder\)"):
        batch.run(jobs, weights_dir=tiny_weights)
    if os.path.isdir("/proc/self"):  # root's permission bits allow /proc, yet no file can be made there
        jobs = [{"video": "v.mp4", "audio": "a.wav", "output": "/proc/nbh-o.mp4"}]
        with pytest.raises(InputError, match=r"cannot write in '/proc' \("):
            batch.run(jobs, batch.BatchConfig(cache_dir=tmp_path / "cache", summary=False),
                      weights_dir=tiny_weights)
    if os.access("/proc/sys", os.W_OK):
        pytest.skip("/proc/sys is writable here: no read-only folder to try")
    jobs = [{"video": "v.mp4", "audio": "a.wav", "output": "/proc/sys/nbh-out/o.mp4"}]
    with pytest.raises(InputError, match=r"'/proc/sys/nbh-out' \(/proc/sys/ is read-only or not yours\)"):
        batch.run(jobs, batch.BatchConfig(cache_dir=tmp_path / "cache", summary=False), weights_dir=tiny_weights)


def test_a_summary_path_that_would_replace_another_file_is_refused_before_ray(tmp_path, tiny_weights, monkeypatch):
    """A new user's --summary s.wav replaced the job's own audio, and a jobs file saved as batch-summary.csv in the
    outputs folder was replaced by the summary: a summary replaces only an earlier summary now."""
    pytest.importorskip("ray")
    from nbhelpers import batch
    from nbhelpers.errors import InputError

    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: pytest.fail("Ray started"))
    (tmp_path / "s.wav").write_bytes(b"RIFF")
    jobs_file = tmp_path / "batch-summary.csv"
    jobs_file.write_text("video,audio,output\nv.mp4,s.wav,o.mp4\n")
    (tmp_path / "notes.txt").write_text("mine")
    cases = [(tmp_path / "s.wav", "is job 'o''s audio"), (jobs_file, "is the jobs file"),
             (tmp_path / "o.mp4", "is job 'o''s output"), (tmp_path, "is a folder"),
             (tmp_path / "notes.txt", "exists and is not a batch summary")]
    for summary, message in cases:
        with pytest.raises(InputError, match=message):
            batch.run(jobs_file, batch.BatchConfig(summary=summary), weights_dir=tiny_weights)
    with pytest.raises(InputError, match="is the jobs file"):  # the default summary path, too
        batch.run(jobs_file, weights_dir=tiny_weights)
    assert (tmp_path / "s.wav").read_bytes() == b"RIFF" and (tmp_path / "notes.txt").read_text() == "mine"
    assert jobs_file.read_text().startswith("video,audio,output")


def test_a_second_batch_over_the_same_outputs_with_its_own_cache_is_refused(tmp_path, tiny_weights, monkeypatch):
    """A new user's second batch over the same outputs with another --cache-dir ran beside the first and removed
    its file in progress: the outputs folder is locked too."""
    pytest.importorskip("ray")
    from nbhelpers import batch
    from nbhelpers.batch.records import batch_lock
    from nbhelpers.errors import InputError

    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: pytest.fail("Ray started"))
    jobs = [{"video": str(tmp_path / "v.mp4"), "audio": str(tmp_path / "a.wav"), "output": str(tmp_path / "o.mp4")}]
    with batch_lock(tmp_path, ".batch.lock", "the outputs folder"):
        with pytest.raises(InputError, match=r"another batch is running over the outputs folder"):
            batch.run(jobs, batch.BatchConfig(cache_dir=tmp_path / "another-cache"), weights_dir=tiny_weights)


def test_a_second_batch_over_the_same_cache_is_refused_while_the_first_runs(tmp_path, tiny_weights, monkeypatch):
    pytest.importorskip("ray")
    from nbhelpers import batch
    from nbhelpers.batch.records import batch_lock
    from nbhelpers.errors import InputError

    starts = []
    # records each start; starts nothing
    monkeypatch.setattr("nbhelpers.batch.cluster.init_ray", lambda *a, **k: starts.append(a) or False)
    jobs = [{"video": str(tmp_path / "v.mp4"), "audio": str(tmp_path / "a.wav"), "output": str(tmp_path / "o.mp4")}]
    partial = tmp_path / ".o.partial-0123abcd.mp4"  # the running batch's file in progress
    partial.write_bytes(b"x")
    with batch_lock(tmp_path / "avatar-cache"):
        with pytest.raises(InputError, match=rf"another batch is running .*\(pid {os.getpid()} on "):
            batch.run(jobs, weights_dir=tiny_weights)
        assert partial.exists() and starts == []  # refused before it removed or started anything
    result = batch.run(jobs, weights_dir=tiny_weights)  # the lock is free again: the job runs (and fails: no files)
    assert result.outcomes[0].status == "failed" and not partial.exists()


@pytest.mark.notorch
def test_csv_headers_take_any_case_and_a_quoted_box_may_follow_a_space(tmp_path):
    from nbhelpers.batch import read_jobs

    (tmp_path / "jobs.csv").write_text('Video, Audio , OUTPUT, Box\na.mp4, 1.wav, o.mp4, "190,160,360,330"\n')
    (job,) = read_jobs(tmp_path / "jobs.csv")
    assert (job.video, job.audio, job.output) == (tmp_path / "a.mp4", tmp_path / "1.wav", tmp_path / "o.mp4")
    assert job.settings == {"box": BOX}


def test_a_job_whose_inputs_pass_the_checks_islikely_work(tmp_path, lavfi_video, lavfi_tone):
    from nbhelpers.batch import check_jobs
    from nbhelpers.batch.records import likely_work, write_hint

    corrupt, jobs = hint_jobs(lavfi_video, lavfi_tone, tmp_path)
    cache = tmp_path / "cache"
    gone, bad = check_jobs(jobs)
    for job in (gone, bad):
        write_hint(cache, job, "InputError: ...")
    assert not likely_work([gone, bad], cache, rerun=False) and likely_work([gone, bad], cache, rerun=True)
    shutil.copy(gone.audio, corrupt)  # now readable: the job goes to a worker
    assert likely_work([bad], cache, rerun=False) and not likely_work([gone], cache, rerun=False)
    worker_failed = check_jobs([dict(jobs[1], audio=str(gone.audio), output=str(tmp_path / "w.mp4"))])
    assert likely_work(worker_failed, cache, rerun=False)  # no face, say: no hint, so a rerun retries it on Ray


@pytest.mark.parametrize("text", ["[1, 2]", "3", '"done"', "{not json", None])
def test_an_output_is_finished_only_with_a_record_object_of_its_inputs_and_size(tmp_path, text):
    from nbhelpers.batch.jobs import Job
    from nbhelpers.batch.records import finished_record, record_path, write_record

    job = Job("o", tmp_path / "a.mp4", tmp_path / "1.wav", tmp_path / "o.mp4")
    job.output.write_bytes(b"x" * 10)
    inputs = {"video": {"sha256": "ab"}}
    write_record(job.output, inputs, frames=3, worker="w", seconds=1.0)
    assert finished_record(job, inputs)["frames"] == 3 and finished_record(job, {"video": {}}) is None
    if text is None:  # the output changed after its record
        job.output.write_bytes(b"x" * 11)
    else:  # a record that is not a JSON object of ours: the output is made again, nothing raises
        record_path(job.output).write_text(text, "utf-8")
    assert finished_record(job, inputs) is None


def test_without_ray_the_command_says_how_to_install_it(tmp_path, tiny_weights):
    (tmp_path / "jobs.csv").write_text("video,audio,output\na.mp4,1.wav,o.mp4\n")
    code = ("import sys; sys.modules['ray'] = None; from nbhelpers.cli.main import main; "
            f"sys.exit(main(['batch', {str(tmp_path / 'jobs.csv')!r}, '--weights', {str(tiny_weights)!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 2
    assert 'pip install "ray>=2.10"' in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------------------------------------
# Batches on a local Ray


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    from nbhelpers.batch import init_ray

    started = init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def media(face_clip, speech_clip, tmp_path_factory):
    """Two 8-frame face clips, five short speech files and one corrupt 'audio' file."""
    videos = [face_clip(8, k) for k in (0, 2)]
    audios = [speech_clip(0.32 + 0.04 * (k % 3), 1 + 0.5 * k) for k in range(5)]
    folder = tmp_path_factory.mktemp("batch-media")
    corrupt = folder / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x24\x00\x00\x00WAVEfmt " + os.urandom(400))
    return videos, audios, corrupt


def six_jobs(media, out):
    """6 jobs over 2 videos; the fourth has the corrupt audio."""
    videos, audios, corrupt = media
    pairs = [(0, audios[0]), (0, audios[1]), (0, audios[2]), (1, corrupt), (1, audios[3]), (1, audios[4])]
    return [{"name": f"j{k}", "video": str(videos[v]), "audio": str(a), "output": str(out / f"j{k}.mp4"),
             "box": BOX} for k, (v, a) in enumerate(pairs)]


def outputs_in(folder):
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def hidden_in(folder):
    """The hidden files a batch left in ``folder`` besides its outputs folder's lock (``.batch.lock``)."""
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.startswith(".")
                  and p.name != ".batch.lock")


def frame_folders():
    """The frame stores' folders in the temporary folder the batch's workers share with this process."""
    import tempfile

    return set(Path(tempfile.gettempdir()).glob("nbhelpers-frames-*"))


@pytest.fixture(scope="module")
def first_run(ray_local, media, tiny_weights, tmp_path_factory):
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run

    out = tmp_path_factory.mktemp("batch-out")
    result = run(six_jobs(media, out), BatchConfig(cpu_workers=2),
                 inference=InferenceConfig(device="cpu", batch_size=4), weights_dir=tiny_weights)
    return out, result


@pytest.mark.slow
def test_six_jobs_with_a_corrupt_audio_give_five_outputs_and_one_error(first_run, media, tiny_weights, ffmpeg):
    from nbhelpers import InferenceConfig, lipsync
    from nbhelpers import media as media_mod

    out, result = first_run
    assert [o.status for o in result.outcomes] == ["done", "done", "done", "failed", "done", "done"]
    bad = result.outcomes[3]
    assert "corrupt.wav" in bad.error and bad.frames == 0
    assert outputs_in(out) == ["batch-summary.csv", "j0.mp4", "j1.mp4", "j2.mp4", "j4.mp4", "j5.mp4"]
    assert hidden_in(out) == [f".j{k}.mp4.batch.json" for k in (0, 1, 2, 4, 5)]  # records, no partial file
    # each face prepared once, by the two workers
    assert result.avatars == {"prepared": 2, "loaded": 0} and len(result.workers) == 2
    # where each preparation's time went: every stage of prepare_avatar, on the worker that made it
    videos, _, _ = media
    assert sorted(p["video"] for p in result.preparations) == sorted(str(v) for v in videos)
    for prep in result.preparations:
        assert prep["status"] == "prepared" and prep["worker"] in result.workers
        assert list(prep["timings"]) == ["frames", "parser_wait", "parse", "vae_wait", "encode", "arrays",
                                         "frames_file", "finish"]
        assert 0 < sum(prep["timings"].values()) <= prep["seconds"] and prep["ended_s"] <= result.wall_s
    cache = sorted(p.name for p in (out / "avatar-cache").iterdir())
    # two avatars, the batch's lock and the hint of j3's failed input check
    assert len(cache) == 4 and {"batch.lock", "failed"} <= set(cache)
    assert [json.loads(p.read_text())["output"] for p in (out / "avatar-cache" / "failed").iterdir()] == [
        str(out / "j3.mp4")]
    for o in result.outcomes:
        if o.status == "done":
            n = len(media_mod.load_audio(o.audio)) * 25 // 16000
            assert o.frames == n == media_mod.probe(o.output).frame_count and o.attempts == 1
    with open(result.summary_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["job"] for r in rows] == [f"j{k}" for k in range(6)]
    assert rows[3]["status"] == "failed" and "corrupt.wav" in rows[3]["error"]
    assert rows[0]["frames"] == str(result.outcomes[0].frames) and float(rows[0]["fps"]) > 0
    text = str(result)
    assert "5 done, 0 skipped, 1 failed" in text and "j3" in text and "fps" in result._repr_html_()

    # a batch output is the offline job's video, frame for frame (computed with the worker's torch threads: the
    # float sums, and so a few rounded pixels, depend on how many threads share them)
    import torch

    videos, audios, _ = media
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        ref = lipsync(videos[1], audios[4], out.parent / "offline-j5.mp4",
                      config=InferenceConfig(device="cpu", batch_size=4), boxes=BOX, weights_dir=tiny_weights)
    finally:
        torch.set_num_threads(threads)
    np.testing.assert_array_equal(decode_frames(out / "j5.mp4", ffmpeg=ffmpeg),
                                  decode_frames(ref.output, ffmpeg=ffmpeg))


@pytest.mark.slow
def test_a_second_run_executes_none(first_run, media, tiny_weights):
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run

    out, _ = first_run
    stamps = {p.name: p.stat().st_mtime_ns for p in out.glob("*.mp4")}
    again = run(six_jobs(media, out), BatchConfig(cpu_workers=2), inference=InferenceConfig(device="cpu", batch_size=4),
                weights_dir=tiny_weights)
    assert [o.status for o in again.outcomes] == ["skipped"] * 3 + ["failed"] + ["skipped"] * 2
    assert again.workers == () and again.frames == 0  # no worker started: nothing ran
    assert [o.frames for o in again.outcomes] == [o.frames for o in first_run[1].outcomes]
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.mp4")} == stamps


@pytest.mark.slow
def test_a_changed_input_or_a_damaged_output_is_made_again(first_run, media, tiny_weights, tmp_path):
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run

    out, first = first_run
    work = tmp_path / "out"
    shutil.copytree(out, work, ignore=shutil.ignore_patterns("avatar-cache"))
    jobs = six_jobs(media, work)
    changed = tmp_path / "changed.wav"
    shutil.copy(media[1][3], changed)  # j1 now speaks j4's audio
    jobs[1]["audio"] = str(changed)
    with open(work / "j2.mp4", "r+b") as fh:  # j2's output damaged (truncated)
        fh.truncate(1000)
    again = run(jobs, BatchConfig(cpu_workers=1, cache_dir=out / "avatar-cache"),
                inference=InferenceConfig(device="cpu", batch_size=4), weights_dir=tiny_weights)
    assert [o.status for o in again.outcomes] == ["skipped", "done", "done", "failed", "skipped", "skipped"]
    assert again.avatars == {"prepared": 0, "loaded": 1}  # the face's avatar came from the shared cache
    assert again.outcomes[1].frames == first.outcomes[4].frames


@pytest.mark.slow
def test_a_worker_killed_during_a_job_still_gives_every_output_once(ray_local, media, tiny_weights, tmp_path,
                                                                   monkeypatch):
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run

    videos, audios, _ = media
    jobs = [{"name": f"k{k}", "video": str(videos[k % 2]), "audio": str(audios[k]),
             "output": str(tmp_path / f"k{k}.mp4"), "box": BOX} for k in range(4)]
    before = frame_folders()
    monkeypatch.setattr("nbhelpers.batch.scheduler.EXIT_AT", {"k2": 3})  # k2's worker exits at its frame 3
    result = run(jobs, BatchConfig(cpu_workers=2), inference=InferenceConfig(device="cpu", batch_size=4),
                 weights_dir=tiny_weights)
    # the killed worker's frames and those of the workers stopped at the end are removed by the batch's end
    assert frame_folders() - before == set()
    assert [o.status for o in result.outcomes] == ["done"] * 4, str(result)
    assert [o.attempts for o in result.outcomes] == [1, 1, 2, 1]
    assert outputs_in(tmp_path) == ["batch-summary.csv", "k0.mp4", "k1.mp4", "k2.mp4", "k3.mp4"]
    assert hidden_in(tmp_path) == [f".k{k}.mp4.batch.json" for k in range(4)]  # no half-written file left
    from nbhelpers import media as media_mod

    for o in result.outcomes:
        assert media_mod.probe(o.output).frame_count == o.frames == len(media_mod.load_audio(o.audio)) * 25 // 16000


def test_two_jobs_at_once_per_worker_and_one_killed_still_give_every_output_once(ray_local, media, tiny_weights,
                                                                                   tmp_path, monkeypatch):
    """One CPU worker running two jobs at a time (both faces prepared at once, then two clips at once over the
    same models); the worker dies during k2, taking the job beside it down too: both run again, every output is
    there once, with the frames its audio gives, and two of the clips ran at the same time."""
    from nbhelpers import InferenceConfig
    from nbhelpers import media as media_mod
    from nbhelpers.batch import BatchConfig, run

    videos, audios, _ = media
    jobs = [{"name": f"k{k}", "video": str(videos[k % 2]), "audio": str(audios[k]),
             "output": str(tmp_path / f"k{k}.mp4"), "box": BOX} for k in range(4)]
    before = frame_folders()
    monkeypatch.setattr("nbhelpers.batch.scheduler.EXIT_AT", {"k2": 3})  # k2's worker exits at its frame 3
    result = run(jobs, BatchConfig(cpu_workers=1, jobs_per_worker=2),
                 inference=InferenceConfig(device="cpu", batch_size=4), weights_dir=tiny_weights)
    assert frame_folders() - before == set()  # no frames left on disk by the killed worker or the closed one
    assert [o.status for o in result.outcomes] == ["done"] * 4, str(result)
    assert result.outcomes[2].attempts == 2 and sum(o.attempts for o in result.outcomes) in (5, 6)
    assert outputs_in(tmp_path) == ["batch-summary.csv", "k0.mp4", "k1.mp4", "k2.mp4", "k3.mp4"]
    assert hidden_in(tmp_path) == [f".k{k}.mp4.batch.json" for k in range(4)]  # no half-written file left
    for o in result.outcomes:
        assert media_mod.probe(o.output).frame_count == o.frames == len(media_mod.load_audio(o.audio)) * 25 // 16000
        assert o.timings.get("generate", 0) > 0
    # Two of the clips ran at the same time: before the kill (the first two), or after it (the two run again).
    spans = sorted((o.ended_s - o.seconds, o.ended_s) for o in result.outcomes)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False)), spans


def test_more_cpu_workers_than_ray_has_cpus_run_on_the_cpus_it_has(ray_local, media, tiny_weights, tmp_path):
    """cpu_workers=3 where Ray offers 2 CPUs: each worker takes one, so a third would wait for a CPU for ever (the
    batch hung there); two workers run the three jobs, with a warning that says so."""
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run
    from nbhelpers.batch.scheduler import cpu_worker_count
    from nbhelpers.errors import FallbackWarning

    assert int(ray_local.cluster_resources()["CPU"]) == 2
    videos, audios, _ = media
    jobs = [{"name": f"c{k}", "video": str(videos[0]), "audio": str(audios[k]), "output": str(tmp_path / f"c{k}.mp4"),
             "box": BOX} for k in range(3)]
    with pytest.warns(FallbackWarning, match=r"cpu_workers=3 is more than the 2 CPU\(s\) Ray offers.*running 2"):
        result = run(jobs, BatchConfig(cpu_workers=3), inference=InferenceConfig(device="cpu", batch_size=4),
                     weights_dir=tiny_weights)
    assert [o.status for o in result.outcomes] == ["done"] * 3 and len(result.workers) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where the cores suffice, or where fewer jobs need fewer
        assert cpu_worker_count(2, 2, 2) == 2 and cpu_worker_count(8, 4, 3) == 3
    with pytest.warns(FallbackWarning):
        assert cpu_worker_count(8, 0, 8) == 1  # a cluster that reports no CPU: one worker


@pytest.mark.gpu
def test_on_a_gpu_one_worker_runs_two_jobs_at_once_and_every_output_is_made(media, tiny_weights, tmp_path):
    """The GPU defaults: one worker per GPU, two jobs at once where its memory holds them (any GPU with 28 GiB
    free: the H200), both faces prepared by it, every clip made with the frames its audio gives."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("ray")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from nbhelpers import media as media_mod
    from nbhelpers.batch import run
    from nbhelpers.gpu.device import free_memory_by_index

    videos, audios, _ = media
    jobs = [{"name": f"g{k}", "video": str(videos[k % 2]), "audio": str(audios[k]),
             "output": str(tmp_path / f"g{k}.mp4"), "box": BOX} for k in range(4)]
    result = run(jobs, weights_dir=tiny_weights)
    assert [o.status for o in result.outcomes] == ["done"] * 4, str(result)
    assert len(result.workers) == torch.cuda.device_count() and all("cuda" in w for w in result.workers)
    two = min(free_memory_by_index().values()) >= 27.6
    assert result.workers_note.startswith("1 worker per GPU; " + ("2 jobs at once" if two else "1 job at once"))
    assert result.avatars == {"prepared": 2, "loaded": 0}
    assert {p["status"] for p in result.preparations} == {"prepared"}
    for o in result.outcomes:
        assert media_mod.probe(o.output).frame_count == o.frames == len(media_mod.load_audio(o.audio)) * 25 // 16000
    events = [e for ev in result.timeline.values() for e, _ in ev]
    assert "loaded vae" in events and ("warm" in events or "warm-up skipped (a clip started)" in events)
    # Each worker renders at most its slots' clips at once and holds as many jobs again: with two slots, its two
    # faces' preparations and jobs were more than two calls at once at some point.
    slots = 2 if two else 1
    for timeline in result.timeline.values():
        renders = held = most_renders = most_held = 0
        for event, _ in sorted(timeline, key=lambda e: e[1]):
            if event.startswith(("prepare ", "job ")) and not event.endswith((" done", " ready", " rendering",
                                                                              " rendered")):
                held += 1
            elif event.endswith(" done"):
                held -= 1
            renders += event.endswith(" rendering") - event.endswith(" rendered")
            most_renders, most_held = max(most_renders, renders), max(most_held, held)
        assert most_renders <= slots, timeline
        if slots == 2:
            assert most_held >= 3, timeline


@pytest.mark.slow
def test_a_jobs_file_with_dot_dot_paths_finds_its_records_and_writes_clean_paths(first_run, media, tiny_weights,
                                                                                 tmp_path):
    from nbhelpers import InferenceConfig
    from nbhelpers.batch import BatchConfig, run

    out, first = first_run
    folder = tmp_path / "jobs"
    folder.mkdir()
    with open(folder / "jobs.csv", "w", newline="") as fh:  # every path relative to the jobs file, through ..
        writer = csv.writer(fh)
        writer.writerow(["name", "video", "audio", "output", "box"])
        for job in six_jobs(media, out):
            writer.writerow([job["name"], *(os.path.relpath(job[k], folder) for k in ("video", "audio", "output")),
                             ",".join(map(str, BOX))])
    assert "../" in (folder / "jobs.csv").read_text()
    config = BatchConfig(cpu_workers=2, cache_dir=tmp_path / "cache", summary=tmp_path / "summary.csv")
    again = run(folder / "jobs.csv", config, inference=InferenceConfig(device="cpu", batch_size=4),
                weights_dir=tiny_weights)
    assert [o.status for o in again.outcomes] == ["skipped"] * 3 + ["failed"] + ["skipped"] * 2  # records found
    with open(tmp_path / "summary.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    for row, o in zip(rows, first.outcomes, strict=True):
        for key in ("video", "audio", "output"):
            assert row[key] == str(getattr(o, key).resolve()) and ".." not in row[key]
    assert "/../" not in str(again) and "corrupt.wav" in rows[3]["error"]


@pytest.mark.slow
def test_a_local_ray_start_prints_no_token_auth_notice():
    pytest.importorskip("ray")
    code = "import ray; from nbhelpers.batch import init_ray; print(init_ray(num_cpus=1)); ray.shutdown()"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(env, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0 and proc.stdout.strip() == "True", proc.stderr
    assert "Token authentication is enabled" not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_sigterm_during_a_batch_exits_143_with_no_partial_file_and_a_summary_of_what_was_left(media, shared_data,
                                                                                            tiny_weights, tmp_path):
    """A new user's SIGTERM mid-batch was taken by Ray's own handler (installed by ``ray.init`` after ours): exit 1,
    no word, and a hidden partial output left behind. Now the command line's handler is kept: the batch stops, its
    workers' partial files are removed, the summary lists the unfinished job as interrupted, and the exit status is
    143 with "terminated"."""
    pytest.importorskip("ray")
    import signal
    import time

    videos, _, _ = media
    out = tmp_path / "out"
    (tmp_path / "jobs.csv").write_text("name,video,audio,output,box\n"
                                       f"long,{videos[0]},{shared_data / 'speech-en-short.wav'},{out / 'long.mp4'},"
                                       f'"{",".join(map(str, BOX))}"\n')
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.Popen([sys.executable, "-m", "nbhelpers", "batch", str(tmp_path / "jobs.csv"), "--weights",
                             str(tiny_weights), "--device", "cpu", "--batch-size", "4"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(env, PYTHONPATH=str(ROOT), NBHELPERS_PROGRESS="0"))
    try:
        deadline = time.monotonic() + 300
        while not list(out.glob(".long.partial-*.mp4")):  # the worker is writing the clip
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "terminated" and "Traceback" not in stderr, stderr
    assert hidden_in(out) == [] and not (out / "long.mp4").exists()
    with open(out / "batch-summary.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["status"] == "interrupted" and "terminated (SIGTERM)" in row["error"], row


@pytest.mark.slow
def test_shutdown_stops_every_process_of_a_local_ray_and_kills_its_monitor_at_once():
    """shutdown_ray() leaves none of the local instance's processes running; its autoscaler monitor is killed
    (SIGKILL) instead of being sent SIGTERM and given Ray's second of grace."""
    pytest.importorskip("ray")
    code = ("import json, ray; from nbhelpers.batch import init_ray, shutdown_ray; init_ray(num_cpus=1); "
            "node = ray._private.worker._global_node; "
            "procs = {k: [i.process for i in v] for k, v in node.all_processes.items()}; shutdown_ray(); "
            "[p.wait(timeout=30) for v in procs.values() for p in v]; "
            "print(json.dumps({'up': ray.is_initialized(), "
            "'codes': {k: [p.returncode for p in v] for k, v in procs.items()}}))")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(env, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["up"] is False
    assert report["codes"]["monitor"] == [-9], report  # killed, not terminated
    assert {"raylet", "gcs_server"} <= set(report["codes"]), report
    assert all(code is not None for codes in report["codes"].values() for code in codes), report


@pytest.mark.slow
def test_a_worker_renders_through_its_slots_one_clip_at_a_time_and_marks_it(media, tiny_weights, tmp_path):
    """A worker with one render slot running two jobs at once (threads, as Ray's would): both clips are made, the
    second renders only once the first has rendered its last batch, and each job's timeline has its steps in
    order (started, ready, rendering, rendered, done)."""
    pytest.importorskip("torch")
    import threading

    from nbhelpers import InferenceConfig
    from nbhelpers import media as media_mod
    from nbhelpers.batch import BatchWorker

    videos, audios, _ = media
    config = InferenceConfig(device="cpu", batch_size=4).to_dict()
    worker = BatchWorker(str(tiny_weights), config, "cpu", threads=1, render_slots=1)
    cfg = {k: v for k, v in InferenceConfig(device="cpu", batch_size=4, landmark_backend="boxes").to_dict().items()
           if k not in ("device", "fp16")}
    avatar = tmp_path / "avatar"
    assert worker.prepare("k", str(videos[0]), str(avatar), cfg, BOX)["ok"]
    replies = {}

    def job(name, audio):
        replies[name] = worker.generate("k", str(avatar), cfg, name, str(audio), str(tmp_path / f"{name}.mp4"))

    threads = [threading.Thread(target=job, args=(n, a)) for n, a in (("x", audios[0]), ("y", audios[1]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert all(r["ok"] for r in replies.values()) and set(replies) == {"x", "y"}, replies
    for name, audio in (("x", audios[0]), ("y", audios[1])):
        assert media_mod.probe(tmp_path / f"{name}.mp4").frame_count == len(media_mod.load_audio(audio)) * 25 // 16000
    when = {event: t for event, t in worker.events()}
    for name in "xy":
        steps = [when[f"job {name}{step}"] for step in ("", " ready", " rendering", " rendered", " done")]
        assert steps == sorted(steps), (name, steps)
    first, second = sorted((when[f"job {n} rendering"], when[f"job {n} rendered"]) for n in "xy")
    assert first[1] <= second[0], (first, second)  # one slot: never two clips rendering at once


@pytest.mark.notorch
def test_a_long_error_is_cut_with_an_ellipsis_and_the_summary_names_the_csv(tmp_path):
    from nbhelpers.batch import BatchResult, JobOutcome
    from nbhelpers.batch.results import ERROR_WIDTH

    long_error = ("WeightsError: 1 weight file(s) this job needs are not usable:\n  musetalkV15/unet.pth: missing\n"
                  "Fix: run `python -m nbhelpers download` " + "x" * 100 + " END")
    outcomes = (JobOutcome("j0", "done", 25, 2.0, "", tmp_path / "a.mp4", tmp_path / "a.wav", tmp_path / "o0.mp4", 1),
                JobOutcome("j1", "failed", 0, 0.5, long_error, tmp_path / "b.mp4", tmp_path / "b.wav",
                           tmp_path / "o1.mp4", 1),
                JobOutcome("j2", "failed", 0, 0.1, "MediaError: short", tmp_path / "c.mp4", tmp_path / "c.wav",
                           tmp_path / "o2.mp4", 1))
    csv_path = tmp_path / "batch-summary.csv"
    result = BatchResult(outcomes=outcomes, summary_csv=csv_path, wall_s=3.0, workers=("host/1 cpu",))
    lines = result.table().splitlines()
    assert len(lines) == 2 + 3  # header, rule, one line per job: the error's own newlines do not break the table
    one_line = " ".join(long_error.split())
    cell = lines[3][lines[0].index("error"):]
    assert cell.endswith("...") and len(cell) == ERROR_WIDTH
    assert cell[:-3] == one_line[:ERROR_WIDTH - 3].rstrip() and "END" not in cell
    assert lines[4].endswith("MediaError: short")  # a short error is shown whole, without the marker
    assert result.summary().endswith(f"1 done, 0 skipped, 2 failed; 25 frames in 3.0 s (8.3 fps) on 1 CPU worker; "
                                     f"full errors in the summary: {csv_path}")
    result.write_csv(csv_path)
    with open(csv_path, newline="") as fh:
        assert list(csv.DictReader(fh))[1]["error"] == long_error  # where the summary line sends the reader

    short = BatchResult(outcomes=outcomes[::2], summary_csv=csv_path, wall_s=3.0)
    assert short.summary().endswith(f"; summary: {csv_path}") and "..." not in short.table()
    no_csv = BatchResult(outcomes=outcomes, summary_csv=None, wall_s=3.0)
    assert no_csv.summary().endswith("; full errors: BatchResult.failed (no summary CSV was written)")
